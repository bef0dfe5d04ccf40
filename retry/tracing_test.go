package retry

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

// foreignBase hides client.HTTPTransport: the Transport cannot hand it the
// attempt and must follow it through net/http/httptrace instead.
type foreignBase struct{ rt http.RoundTripper }

func (f foreignBase) RoundTrip(r *http.Request) (*http.Response, error) { return f.rt.RoundTrip(r) }

// TestBothTracingRoutesClassifyAlike: an attempt's stage and evidence are
// the same whether the base reports to the attempt directly (client.HTTPTransport)
// or only through httptrace (any other base): a refused connect is
// connect_refused not_sent; a reset after the server read the request is
// connection_reset sent_no_response (ambiguous for a POST); a response
// after a failed attempt is counted once.
func TestBothTracingRoutesClassifyAlike(t *testing.T) {
	for _, direct := range []bool{true, false} {
		tr, _, _ := testTransport(t, nil)
		if !direct {
			tr.Base = foreignBase{rt: tr.Base}
		}
		_, err := tr.RoundTrip(rawtest.Post(t, closedPort(t), "x"))
		var e *Error
		if !errors.As(err, &e) || e.Outcome != engine.OutcomeNotSent {
			t.Fatalf("direct %v: refused: %v", direct, err)
		}
		for _, a := range e.Trace.Attempts {
			if a.Failure != engine.ConnectRefused || a.Stage != StageConnect || a.Evidence != engine.NotSent {
				t.Fatalf("direct %v: refused attempt %+v", direct, a)
			}
		}

		var executed atomic.Int64
		srv := resetAfterRead(t, 1, &executed)
		_, err = tr.RoundTrip(rawtest.Post(t, srv.URL(), "pay"))
		var amb *AmbiguousError
		if !errors.As(err, &amb) || len(amb.Trace.Attempts) != 1 {
			t.Fatalf("direct %v: reset after read: %v", direct, err)
		}
		if a := amb.Trace.Attempts[0]; a.Failure != engine.ConnectionReset || a.Stage != StageHeaders || a.Evidence != engine.SentNoResponse {
			t.Fatalf("direct %v: reset attempt %+v", direct, a)
		}

		executed.Store(0)
		resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
		if err != nil {
			t.Fatalf("direct %v: GET: %v", direct, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		trc, _ := TraceOf(resp)
		if resp.StatusCode != 200 || len(trc.Attempts) != 2 || trc.Attempts[0].Failure != engine.ConnectionReset || trc.Attempts[0].HiddenRetries != 0 {
			t.Fatalf("direct %v: GET %d attempts %+v", direct, resp.StatusCode, trc.Attempts)
		}
		if executed.Load() != 2 {
			t.Fatalf("direct %v: upstream executed the GET %d times", direct, executed.Load())
		}
		if got := tr.ht != nil; got != direct {
			t.Fatalf("attempts handed to client.HTTPTransport %v, want %v", got, direct)
		}
	}
}
