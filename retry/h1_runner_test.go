package retry

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/client"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

// TestH1InvalidRequestNeverDispatched: a header the wire cannot carry is
// request_invalid, not_sent, and no connection is opened for it.
func TestH1InvalidRequestNeverDispatched(t *testing.T) {
	var seen atomic.Int64
	srv := rawtest.AnswerEach(t, &seen, func(*http.Request, int) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	tr, _, _ := testTransport(t, nil)
	for _, edit := range []func(*http.Request){
		func(r *http.Request) { r.Header["X-Bad"] = []string{"a\r\nInjected: 1"} },
		func(r *http.Request) { r.Header["Bad Name"] = []string{"x"} },
		func(r *http.Request) { r.Host = "a b" },
		func(r *http.Request) { r.Method = "GE T" },
	} {
		req := rawtest.Post(t, srv.URL(), "x")
		edit(req)
		_, err := tr.RoundTrip(req)
		var e *Error
		if !errors.As(err, &e) || e.Outcome != engine.OutcomeNotSent || e.Attempts != 1 ||
			e.Trace.Attempts[0].Failure != engine.RequestInvalid || !errors.Is(err, ErrRequestInvalid) {
			t.Fatalf("err %v", err)
		}
	}
	if srv.Conns() != 0 || seen.Load() != 0 {
		t.Fatalf("%d connections, %d requests reached the upstream", srv.Conns(), seen.Load())
	}
}

// TestH1ResponseHeaderLimit: a response head over MaxResponseHeaderBytes
// fails the attempt; the upstream answered, so it is never not_sent.
func TestH1ResponseHeaderLimit(t *testing.T) {
	var seen atomic.Int64
	srv := rawtest.AnswerEach(t, &seen, func(*http.Request, int) (string, bool) {
		return "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("b", 8<<10) + "\r\nContent-Length: 2\r\n\r\nok", false
	})
	tr, _, _ := testTransport(t, func(p *Policy) { p.MaxAttempts = 1 })
	tr.Base = client.NewHTTPTransport(client.HTTPOptions{MaxResponseHeaderBytes: 4 << 10})
	_, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "x"))
	var a *AmbiguousError
	if !errors.As(err, &a) || !strings.Contains(err.Error(), "response header exceeds the limit") {
		t.Fatalf("err %v", err)
	}
	if ev := a.Trace.Attempts[0].Evidence; ev != engine.SentNoResponse {
		t.Fatalf("evidence %v", ev)
	}
}
