package retry

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr + "/"
}

func TestConnectRefusedPOSTIsRetriedThenNotSent(t *testing.T) {
	tr, waits, traces := testTransport(t, nil)
	resp, err := tr.RoundTrip(rawtest.Post(t, closedPort(t), "pay 10"))
	if resp != nil {
		t.Fatalf("got a response %d", resp.StatusCode)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %T %v, want *Error", err, err)
	}
	if e.Outcome != engine.OutcomeNotSent || e.Status != 503 || e.Attempts != 3 {
		t.Fatalf("outcome %v status %d attempts %d, want not-sent 503 3", e.Outcome, e.Status, e.Attempts)
	}
	if !errors.Is(err, ErrNotSent) || errors.Is(err, ErrAmbiguous) {
		t.Fatal("errors.Is does not match the outcome")
	}
	for _, a := range e.Trace.Attempts {
		if a.Failure != engine.ConnectRefused || a.Evidence != engine.NotSent {
			t.Fatalf("attempt %d: %v %v, want connect_refused not_sent", a.N, a.Failure, a.Evidence)
		}
	}
	if got := len(waits.all()); got != 2 {
		t.Fatalf("%d waits, want 2", got)
	}
	if len(*traces) != 1 {
		t.Fatalf("OnTrace called %d times", len(*traces))
	}
}

// resetAfterRead answers the first `fail` requests by reading them whole and
// resetting the connection (the server executed them), then answers 200.
func resetAfterRead(t *testing.T, fail int64, executed *atomic.Int64) *rawtest.Server {
	return rawtest.NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		for {
			_, _, err := rawtest.ReadReq(br)
			if err != nil {
				return
			}
			if executed.Add(1) <= fail {
				rawtest.Reset(c)
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
}

func TestResetAfterReadPOSTIsAmbiguous(t *testing.T) {
	var executed atomic.Int64
	srv := resetAfterRead(t, 1, &executed)
	tr, _, _ := testTransport(t, nil)
	_, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "pay 10"))
	var a *AmbiguousError
	if !errors.As(err, &a) {
		t.Fatalf("err = %T %v, want *AmbiguousError", err, err)
	}
	if executed.Load() != 1 || a.Attempts != 1 || a.Status != 502 {
		t.Fatalf("executed %d, attempts %d, status %d; want 1, 1, 502", executed.Load(), a.Attempts, a.Status)
	}
	at := a.Trace.Attempts[0]
	if at.Evidence != engine.SentNoResponse || at.Decision.Decision != engine.Ambiguous {
		t.Fatalf("attempt: %v %v %v", at.Failure, at.Evidence, at.Decision)
	}
	if !errors.Is(err, ErrAmbiguous) {
		t.Fatal("not ErrAmbiguous")
	}
}

func TestResetAfterReadGETIsRetried(t *testing.T) {
	var executed atomic.Int64
	srv := resetAfterRead(t, 2, &executed)
	tr, _, _ := testTransport(t, nil)
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" || executed.Load() != 3 {
		t.Fatalf("body %q executed %d", b, executed.Load())
	}
	trc, _ := TraceOf(resp)
	if len(trc.Attempts) != 3 || trc.Attempts[0].Failure != engine.ConnectionReset {
		t.Fatalf("attempts %+v", trc.Attempts)
	}
}

func TestStatus503ThenOKForGET(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			http.Error(w, "busy", 503)
			return
		}
		io.WriteString(w, "fine")
	}))
	defer srv.Close()
	tr, _, _ := testTransport(t, nil)
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "fine" || hits.Load() != 2 {
		t.Fatalf("status %d body %q hits %d", resp.StatusCode, b, hits.Load())
	}
}

func TestStatus503ForPOSTIsRelayedAmbiguous(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, "upstream busy", 503)
	}))
	defer srv.Close()
	tr, _, traces := testTransport(t, nil)
	resp, err := tr.RoundTrip(rawtest.Post(t, srv.URL, "order"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get(HeaderOutcome) != "ambiguous" || hits.Load() != 1 {
		t.Fatalf("status %d outcome %q hits %d", resp.StatusCode, resp.Header.Get(HeaderOutcome), hits.Load())
	}
	if !strings.Contains(string(b), "upstream busy") {
		t.Fatalf("body %q", b)
	}
	if len(*traces) != 1 || (*traces)[0].Outcome != engine.OutcomeAmbiguous {
		t.Fatalf("trace outcome not ambiguous")
	}
}

func TestStatus429WaitsRetryAfter(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(429)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	tr, waits, _ := testTransport(t, nil)
	resp, err := tr.RoundTrip(rawtest.Post(t, srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	w := waits.all()
	if resp.StatusCode != 200 || len(w) != 1 || w[0] < 2*time.Second {
		t.Fatalf("status %d waits %v, want one wait >= 2s", resp.StatusCode, w)
	}
	trc, _ := TraceOf(resp)
	if d := trc.Attempts[0].Decision; d.Decision != engine.Retry || d.Wait < 2*time.Second {
		t.Fatalf("decision %+v", d)
	}
}

func TestStatus429RetryAfterBeyondDeadlineIsNotRetried(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Retry-After", "60")
		w.WriteHeader(429)
	}))
	defer srv.Close()
	tr, _, _ := testTransport(t, nil)
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	trc, _ := TraceOf(resp)
	if resp.StatusCode != 429 || hits.Load() != 1 || trc.Attempts[0].Decision.Reason != engine.ReasonRetryAfter {
		t.Fatalf("status %d hits %d decision %+v", resp.StatusCode, hits.Load(), trc.Attempts[0].Decision)
	}
}

func TestStatus425RetriedOnlyOnce(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(425)
	}))
	defer srv.Close()
	tr, _, _ := testTransport(t, func(p *Policy) { p.MaxAttempts = 5 })
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	trc, _ := TraceOf(resp)
	if resp.StatusCode != 425 || hits.Load() != 2 || trc.Attempts[1].Decision.Reason != engine.ReasonTooEarly {
		t.Fatalf("status %d hits %d attempts %+v", resp.StatusCode, hits.Load(), trc.Attempts)
	}
}

// slowServer reads each request whole and never answers.
func slowServer(t *testing.T, executed *atomic.Int64) *rawtest.Server {
	return rawtest.NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		if _, _, err := rawtest.ReadReq(br); err != nil {
			return
		}
		executed.Add(1)
		io.Copy(io.Discard, br) // until the client gives up
	})
}

func TestResponseTimeout(t *testing.T) {
	t.Run("GET retried then failed 504", func(t *testing.T) {
		var executed atomic.Int64
		srv := slowServer(t, &executed)
		tr, _, _ := testTransport(t, func(p *Policy) { p.AttemptTimeout = 100 * time.Millisecond })
		_, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
		var e *Error
		if !errors.As(err, &e) || e.Outcome != engine.OutcomeFailed || e.Status != 504 || e.Attempts != 3 {
			t.Fatalf("err %v", err)
		}
		if a := e.Trace.Attempts[0]; a.Failure != engine.ResponseTimeout || a.Duration < 100*time.Millisecond {
			t.Fatalf("failure %v after %v", a.Failure, a.Duration)
		}
		if executed.Load() != 3 {
			t.Fatalf("executed %d", executed.Load())
		}
	})
	t.Run("POST ambiguous 504", func(t *testing.T) {
		var executed atomic.Int64
		srv := slowServer(t, &executed)
		tr, _, _ := testTransport(t, func(p *Policy) { p.AttemptTimeout = 100 * time.Millisecond })
		_, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "charge"))
		var a *AmbiguousError
		if !errors.As(err, &a) || a.Status != 504 || a.Attempts != 1 {
			t.Fatalf("err %v", err)
		}
		if executed.Load() != 1 {
			t.Fatalf("executed %d", executed.Load())
		}
	})
}

// TestResponseTimeoutAfterTheFirstByte: an upstream that starts its answer
// (an interim 100 Continue, or part of a status line) and then stalls past
// the attempt timeout gave no final response header in time: the attempt is
// response_timeout (spec section 2), the ambiguous status 504, not a reset's
// 502.
func TestResponseTimeoutAfterTheFirstByte(t *testing.T) {
	for _, tc := range []struct{ name, start string }{
		{"interim 100 Continue", "HTTP/1.1 100 Continue\r\n\r\n"},
		{"part of the status line", "HTTP/1.1 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var executed atomic.Int64
			srv := rawtest.NewServer(t, func(c net.Conn, n int) {
				br := bufio.NewReader(c)
				if _, _, err := rawtest.ReadReq(br); err != nil {
					return
				}
				executed.Add(1)
				io.WriteString(c, tc.start)
				io.Copy(io.Discard, br) // until the client gives up
			})
			tr, _, _ := testTransport(t, func(p *Policy) { p.AttemptTimeout = 100 * time.Millisecond })
			_, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "charge"))
			var a *AmbiguousError
			if !errors.As(err, &a) || a.Status != 504 || a.Attempts != 1 {
				t.Fatalf("err %v, want ambiguous 504 after 1 attempt", err)
			}
			if at := a.Trace.Attempts[0]; at.Failure != engine.ResponseTimeout || at.Duration < 100*time.Millisecond {
				t.Fatalf("failure %v after %v, want response_timeout", at.Failure, at.Duration)
			}
			if executed.Load() != 1 {
				t.Fatalf("executed %d", executed.Load())
			}
		})
	}
}

func TestBodyBreaksBeforeFirstByteIsRetried(t *testing.T) {
	var hits atomic.Int64
	srv := rawtest.NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		if _, _, err := rawtest.ReadReq(br); err != nil {
			return
		}
		if hits.Add(1) == 1 {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
			time.Sleep(20 * time.Millisecond) // not synchronisation: the upstream breaks off after its head, as a failing one does
			rawtest.Reset(c)
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789")
	})
	tr, _, _ := testTransport(t, nil)
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "0123456789" || hits.Load() != 2 {
		t.Fatalf("body %q err %v hits %d", b, err, hits.Load())
	}
	trc, _ := TraceOf(resp)
	if trc.Attempts[0].Failure != engine.BodyInterrupted || trc.Attempts[0].Evidence != engine.PartialResponse {
		t.Fatalf("first attempt %+v", trc.Attempts[0])
	}
}

func TestBodyBreaksMidBodyIsDelivered(t *testing.T) {
	var hits atomic.Int64
	srv := rawtest.NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		if _, _, err := rawtest.ReadReq(br); err != nil {
			return
		}
		hits.Add(1)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
		time.Sleep(20 * time.Millisecond) // not synchronisation: the upstream breaks off mid-body, as a failing one does
		rawtest.Reset(c)
	})
	tr, _, traces := testTransport(t, nil)
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err == nil || string(b) != "01234" {
		t.Fatalf("body %q err %v, want 01234 and an error", b, err)
	}
	resp.Body.Close()
	if hits.Load() != 1 {
		t.Fatalf("hits %d", hits.Load())
	}
	if len(*traces) != 1 {
		t.Fatalf("OnTrace %d times", len(*traces))
	}
	last := (*traces)[0].Attempts[len((*traces)[0].Attempts)-1]
	if last.Failure != engine.BodyInterrupted || last.Status != 200 {
		t.Fatalf("last attempt %+v", last)
	}
}

func TestOneShotBodyNotRetried(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(503)
	}))
	defer srv.Close()
	tr, _, _ := testTransport(t, nil)
	req, _ := http.NewRequest(http.MethodPut, srv.URL, io.NopCloser(strings.NewReader("stream")))
	if req.GetBody != nil {
		t.Fatal("test needs a body without GetBody")
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	trc, _ := TraceOf(resp)
	if resp.StatusCode != 503 || hits.Load() != 1 || trc.Body != engine.BodyOneShot ||
		trc.Attempts[0].Decision.Reason != engine.ReasonBodyNotReplayable {
		t.Fatalf("status %d hits %d trace %+v", resp.StatusCode, hits.Load(), trc)
	}
}

func TestBudgetBoundsRetriesUnderOutage(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(503)
	}))
	defer srv.Close()
	cfg := engine.BudgetConfig{Ratio: 0.2, MinPerSecond: 1, TTL: 10 * time.Second}
	tr, _, _ := testTransport(t, func(p *Policy) { p.Budget = cfg; p.MaxAttempts = 3 })
	const originals = 200
	denied := 0
	for range originals {
		resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		trc, _ := TraceOf(resp)
		if trc.Attempts[len(trc.Attempts)-1].Decision.Reason == engine.ReasonBudgetExhausted {
			denied++
		}
	}
	retries := hits.Load() - originals
	bound := cfg.Ratio*originals + cfg.MinPerSecond*cfg.TTL.Seconds()
	if float64(retries) > bound {
		t.Fatalf("%d retries for %d originals, bound %.0f", retries, originals, bound)
	}
	if denied == 0 || retries == 0 {
		t.Fatalf("retries %d, budget denials %d: the budget was not exercised", retries, denied)
	}
	t.Logf("%d originals, %d retries (bound %.0f), %d budget denials", originals, retries, bound, denied)
}

func TestKeptResponseReturnedWhenLaterAttemptNotSent(t *testing.T) {
	// GET: 503, then the upstream is gone (connect refused): the caller
	// gets the 503, the last response there is.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/"
	go func() {
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		rawtest.ReadReq(br)
		io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy")
	}()
	tr, _, _ := testTransport(t, nil)
	resp, err := tr.RoundTrip(rawtest.Get(t, url))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	trc, _ := TraceOf(resp)
	if resp.StatusCode != 503 || string(b) != "busy" || len(trc.Attempts) != 3 {
		t.Fatalf("status %d body %q attempts %d", resp.StatusCode, b, len(trc.Attempts))
	}
}

func TestBulkheadPermitNotHeldWhileWaiting(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			w.WriteHeader(503)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	tr, _, _ := testTransport(t, nil)
	var held atomic.Int64
	var heldWhileWaiting []int64
	tr.Acquire = func(ctx context.Context, upstream string) (func(), error) {
		held.Add(1)
		return func() { held.Add(-1) }, nil
	}
	tr.Sleep = func(ctx context.Context, d time.Duration) error {
		heldWhileWaiting = append(heldWhileWaiting, held.Load())
		return nil
	}
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	if held.Load() != 1 {
		t.Fatalf("permits held with the response open: %d", held.Load())
	}
	resp.Body.Close()
	if held.Load() != 0 || len(heldWhileWaiting) != 1 || heldWhileWaiting[0] != 0 {
		t.Fatalf("held after close %d, while waiting %v", held.Load(), heldWhileWaiting)
	}
}

func TestBulkheadTimeoutIsPoolTimeout(t *testing.T) {
	tr, _, _ := testTransport(t, nil)
	tr.Acquire = func(ctx context.Context, upstream string) (func(), error) {
		return nil, fmt.Errorf("bulkhead full for %s", upstream)
	}
	_, err := tr.RoundTrip(rawtest.Post(t, "http://127.0.0.1:9/", "x"))
	var e *Error
	if !errors.As(err, &e) || e.Outcome != engine.OutcomeNotSent || e.Trace.Attempts[0].Failure != engine.PoolTimeout {
		t.Fatalf("err %v", err)
	}
}
