package retry

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/testkit/promtest"
	"github.com/egret-proxy/egret/retry/client"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
	"github.com/egret-proxy/egret/witness"
)

// resetFirstConn resets its first connection as soon as it is accepted
// (nothing read: the server never saw the request) and answers 200 on the
// others. It resets once dialed is closed, then closes resetDone.
func resetFirstConn(t *testing.T, executed *atomic.Int64, dialed, resetDone chan struct{}) *rawtest.Server {
	return rawtest.NewServer(t, func(c net.Conn, n int) {
		if n == 1 {
			select {
			case <-dialed:
			case <-time.After(5 * time.Second):
			}
			rawtest.Reset(c)
			close(resetDone)
			return
		}
		br := bufio.NewReader(c)
		for {
			if _, _, err := rawtest.ReadReq(br); err != nil {
				return
			}
			executed.Add(1)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
}

// resetBeforeWrite returns a server whose first connection is reset before
// the request is written on it, and a Transport with witness w that waits
// for that reset before handing the connection to net/http.
func resetBeforeWrite(t *testing.T, w witness.Witness) (*Transport, *rawtest.Server, *atomic.Int64) {
	executed := new(atomic.Int64)
	dialed, resetDone := make(chan struct{}), make(chan struct{})
	srv := resetFirstConn(t, executed, dialed, resetDone)
	var dials atomic.Int64
	base := client.NewHTTPTransport(client.HTTPOptions{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil && dials.Add(1) == 1 {
			close(dialed)
			select {
			case <-resetDone:
			case <-time.After(5 * time.Second):
			}
			// The reset is in the socket before the transport gets it.
			if err := rawtest.PollFIN(c); err != nil {
				c.Close()
				return nil, err
			}
		}
		return c, err
	}})
	t.Cleanup(base.CloseIdleConnections)
	tr, _, _ := testTransport(t, nil)
	tr.Base = base
	if w != nil {
		tr.Witness = w
	}
	return tr, srv, executed
}

func counters(sent, segs uint64) witness.Counters {
	return witness.Counters{BytesSent: sent, HasBytesSent: true, DataSegsOut: segs, HasDataSegsOut: true}
}

func TestWitnessMemoryUpgradesOnlyWithProof(t *testing.T) {
	for _, tc := range []struct {
		name    string
		script  []witness.Counters
		upgrade bool
	}{
		{"counters still", []witness.Counters{counters(100, 3)}, true},
		{"counters moved", []witness.Counters{counters(100, 3), counters(180, 4), counters(260, 5), counters(340, 6)}, false},
		{"unreadable", []witness.Counters{{}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := witness.NewMemory(tc.script...)
			tr, srv, executed := resetBeforeWrite(t, mem)
			reg := prometheus.NewRegistry()
			m, err := NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			tr.Metrics = m
			resp, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "pay"))
			upgrades := promtest.CounterSum(t, reg, "egret_retry_witness_upgrades_total")
			if want := map[bool]float64{true: 1, false: 0}[tc.upgrade]; upgrades != want {
				t.Fatalf("egret_retry_witness_upgrades_total = %v, want %v", upgrades, want)
			}
			if !tc.upgrade {
				var a *AmbiguousError
				if !errors.As(err, &a) {
					t.Fatalf("err %v, want ambiguous", err)
				}
				at := a.Trace.Attempts[0]
				if at.Upgraded || at.Evidence != engine.SentNoResponse {
					t.Fatalf("attempt %+v", at)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			trc, _ := TraceOf(resp)
			at := trc.Attempts[0]
			if !at.Upgraded || at.Evidence != engine.NotSent || at.Decision.Reason != engine.ReasonNotSent {
				t.Fatalf("first attempt %+v", at)
			}
			if at.Failure.Evidence() != engine.SentNoResponse || at.WitnessBefore.Source != "memory" || at.WitnessAfter.Source != "memory" {
				t.Fatalf("first attempt %+v", at)
			}
			if executed.Load() != 1 || len(trc.Attempts) != 2 || mem.Calls() < 2 {
				t.Fatalf("executed %d attempts %d snapshots %d", executed.Load(), len(trc.Attempts), mem.Calls())
			}
		})
	}
}

// TestWitnessTCPInfoProvesNotSent drives a POST onto a socket the server
// reset before the request was written: the write fails, which alone is
// sent_no_response (ambiguous for a POST); TCP_INFO proves no byte left and
// the request is retried.
func TestWitnessTCPInfoProvesNotSent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("TCP_INFO is Linux-only")
	}
	for _, withWitness := range []bool{true, false} {
		name := "without witness"
		if withWitness {
			name = "tcp_info"
		}
		t.Run(name, func(t *testing.T) {
			var w witness.Witness
			if withWitness {
				w = witness.TCPInfo{}
			}
			tr, srv, executed := resetBeforeWrite(t, w)
			resp, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "pay"))
			if !withWitness {
				var a *AmbiguousError
				if !errors.As(err, &a) || executed.Load() != 0 {
					t.Fatalf("err %v executed %d, want ambiguous and 0", err, executed.Load())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			trc, _ := TraceOf(resp)
			at := trc.Attempts[0]
			if !at.Upgraded || at.Evidence != engine.NotSent || at.WitnessAfter.Source != "tcp_info" {
				t.Fatalf("first attempt %+v", at)
			}
			if at.WitnessBefore.BytesSent != at.WitnessAfter.BytesSent {
				t.Fatalf("upgraded although bytes moved: %+v", at)
			}
			if executed.Load() != 1 || len(trc.Attempts) != 2 {
				t.Fatalf("executed %d attempts %d", executed.Load(), len(trc.Attempts))
			}
		})
	}
}

// TestWitnessTCPInfoRefusesWhenBytesLeft: a server that read the request
// and reset; the real counters moved, so no upgrade.
func TestWitnessTCPInfoRefusesWhenBytesLeft(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("TCP_INFO is Linux-only")
	}
	var executed atomic.Int64
	srv := resetAfterRead(t, 1, &executed)
	tr, _, _ := testTransport(t, nil)
	tr.Witness = witness.TCPInfo{}
	_, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "pay"))
	var a *AmbiguousError
	if !errors.As(err, &a) || executed.Load() != 1 {
		t.Fatalf("err %v executed %d", err, executed.Load())
	}
	at := a.Trace.Attempts[0]
	if at.Upgraded || at.WitnessAfter.BytesSent <= at.WitnessBefore.BytesSent {
		t.Fatalf("attempt %+v", at)
	}
}

// staleAfterFirst answers the first request of a connection and, on the
// second, reads it whole (executes it) and closes without answering: a
// keep-alive connection that dies just as it is reused.
func staleAfterFirst(t *testing.T, executed *atomic.Int64) *rawtest.Server {
	return rawtest.NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		for i := 1; ; i++ {
			if _, _, err := rawtest.ReadReq(br); err != nil {
				return
			}
			executed.Add(1)
			if i == 2 {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
}

func TestNoHiddenRetryOfNonIdempotentGET(t *testing.T) {
	var executed atomic.Int64
	srv := staleAfterFirst(t, &executed)
	tr, _, _ := testTransport(t, func(p *Policy) {
		// A route declares this GET non-idempotent (it has side effects).
		p.Idempotency = engine.Idempotency{RouteSet: true, Route: false}
	})
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_, err = tr.RoundTrip(rawtest.Get(t, srv.URL()))
	var a *AmbiguousError
	if !errors.As(err, &a) {
		t.Fatalf("err %v, want ambiguous", err)
	}
	if executed.Load() != 2 || srv.Conns() != 1 {
		t.Fatalf("executed %d on %d connections: net/http replayed a non-idempotent GET", executed.Load(), srv.Conns())
	}
}

// TestIdempotentGETOnDeadConnIsAnAttempt: net/http would replay the GET by
// itself on the dead pooled connection; it is the engine's retry instead,
// counted, under the budget and max_attempts.
func TestIdempotentGETOnDeadConnIsAnAttempt(t *testing.T) {
	t.Run("client.HTTPTransport", func(t *testing.T) { idempotentGETOnDeadConn(t, false) })
	t.Run("net/http Transport", func(t *testing.T) { idempotentGETOnDeadConn(t, true) })
}

func idempotentGETOnDeadConn(t *testing.T, netHTTP bool) {
	var executed atomic.Int64
	srv := staleAfterFirst(t, &executed)
	tr, _, _ := testTransport(t, nil)
	if netHTTP {
		nh := &http.Transport{}
		t.Cleanup(nh.CloseIdleConnections)
		tr.Base = nh
	}
	for i := range 2 {
		resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if i == 1 {
			trc, _ := TraceOf(resp)
			if len(trc.Attempts) != 2 || trc.Attempts[0].HiddenRetries != 0 || trc.Attempts[0].Failure != engine.ConnectionReset {
				t.Fatalf("attempts %+v", trc.Attempts)
			}
		}
	}
	if executed.Load() != 3 || srv.Conns() != 2 {
		t.Fatalf("executed %d conns %d", executed.Load(), srv.Conns())
	}
}

// TestNoHiddenRetriesBeyondMaxAttempts: an upstream that resets every
// request after reading it, behind many pooled connections. net/http alone
// would replay a GET on each of them; the upstream must see max_attempts.
func TestNoHiddenRetriesBeyondMaxAttempts(t *testing.T) {
	var executed atomic.Int64
	var warm atomic.Bool
	srv := rawtest.NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		for {
			if _, _, err := rawtest.ReadReq(br); err != nil {
				return
			}
			if !warm.Load() {
				// Not synchronisation: each warm-up answer is held 20 ms so
				// that the warm-up requests overlap and the pool opens many
				// connections; what is checked is the count of executions.
				time.Sleep(20 * time.Millisecond)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				continue
			}
			executed.Add(1)
			rawtest.Reset(c)
			return
		}
	})
	tr, _, _ := testTransport(t, nil)
	// Warm up: ten pooled connections.
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL())); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	warm.Store(true)
	_, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
	var e *Error
	if !errors.As(err, &e) || e.Outcome != engine.OutcomeFailed {
		t.Fatalf("err %v", err)
	}
	if executed.Load() != 3 || e.Attempts != 3 {
		t.Fatalf("upstream executed %d times in %d attempts (max_attempts 3)", executed.Load(), e.Attempts)
	}
}

func TestDeadlineStopsRetries(t *testing.T) {
	tr, _, _ := testTransport(t, nil)
	tr.Sleep = nil // real waits
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	var executed atomic.Int64
	srv := slowServer(t, &executed)
	tr.Policy = func(*http.Request) Policy {
		p := DefaultPolicy("")
		p.MaxAttempts = 10
		p.AttemptTimeout = 60 * time.Millisecond
		p.MinAttempt = 50 * time.Millisecond
		return p
	}
	req := rawtest.Get(t, srv.URL()).WithContext(ctx)
	start := time.Now()
	_, err := tr.RoundTrip(req)
	var e *Error
	if !errors.As(err, &e) || e.Status != 504 {
		t.Fatalf("err %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("took %v", el)
	}
	last := e.Trace.Attempts[len(e.Trace.Attempts)-1]
	if last.Decision.Reason != engine.ReasonDeadline || len(e.Trace.Attempts) >= 10 {
		t.Fatalf("attempts %d, last %+v", len(e.Trace.Attempts), last.Decision)
	}
}

// TestNoHiddenRetryOfPOSTWithIdempotencyKey: net/http replays a request that
// carries an Idempotency-Key on its own; the upstream does not declare that
// it honours keys, so the POST is not idempotent and must not run twice.
func TestNoHiddenRetryOfPOSTWithIdempotencyKey(t *testing.T) {
	var executed atomic.Int64
	srv := staleAfterFirst(t, &executed)
	tr, _, _ := testTransport(t, nil)
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	req := rawtest.Post(t, srv.URL(), "charge 10")
	req.Header.Set("Idempotency-Key", "k-1")
	_, err = tr.RoundTrip(req)
	var a *AmbiguousError
	if !errors.As(err, &a) {
		t.Fatalf("err %v, want ambiguous", err)
	}
	if executed.Load() != 2 || srv.Conns() != 1 {
		t.Fatalf("executed %d on %d connections: net/http replayed the POST", executed.Load(), srv.Conns())
	}
}

// TestWitnessTLSResetAfterHandshake: a TLS upstream that completes the
// handshake and resets before the request is written (load shedding). The
// handshake's bytes are not the request's: TCP_INFO proves not_sent and
// the POST is retried.
func TestWitnessTLSResetAfterHandshake(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("TCP_INFO is Linux-only")
	}
	ts := httptest.NewTLSServer(nil) // only for its certificate and client roots
	roots := ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	cert := ts.TLS
	ts.Close()
	var executed atomic.Int64
	// clientDone: the client's handshake is over; shed: the server has
	// reset that connection.
	clientDone, shed := make(chan struct{}), make(chan struct{})
	srv := rawtest.NewServer(t, func(c net.Conn, n int) {
		tc := tls.Server(c, cert)
		if err := tc.Handshake(); err != nil {
			return
		}
		if n == 1 {
			<-clientDone
			rawtest.Reset(c)
			close(shed)
			return
		}
		br := bufio.NewReader(tc)
		for {
			if _, _, err := rawtest.ReadReq(br); err != nil {
				return
			}
			executed.Add(1)
			io.WriteString(tc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	dialed := make(chan net.Conn, 4)
	base := client.NewHTTPTransport(client.HTTPOptions{TLS: &tls.Config{RootCAs: roots, ServerName: "example.com"},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				dialed <- c
			}
			return c, err
		}})
	t.Cleanup(base.CloseIdleConnections)
	tr, _, _ := testTransport(t, nil)
	tr.Base = base
	tr.Witness = witness.TCPInfo{}
	var handshakes atomic.Int64
	req := rawtest.Post(t, "https://"+srv.Addr()+"/", "pay")
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		TLSHandshakeDone: func(tls.ConnectionState, error) {
			if handshakes.Add(1) == 1 {
				close(clientDone)
				<-shed                    // hand the connection over only once the server shed it
				rawtest.PollFIN(<-dialed) // and its reset is in the socket
			}
		},
	}))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	trc, _ := TraceOf(resp)
	at := trc.Attempts[0]
	if !at.Upgraded || at.Evidence != engine.NotSent || executed.Load() != 1 || len(trc.Attempts) != 2 {
		t.Fatalf("executed %d, attempts %+v", executed.Load(), trc.Attempts)
	}
}
