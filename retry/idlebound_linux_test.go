//go:build linux

package retry

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/retry/client"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
	"github.com/egret-proxy/egret/witness"
)

// keepAliveServer answers every request 200 on a keep-alive connection,
// announcing keepAlive (a Keep-Alive field value, "" for none), and counts
// the POSTs it executed.
func keepAliveServer(t *testing.T, keepAlive string, posts *atomic.Int64) *rawtest.Server {
	return rawtest.NewServer(t, func(c net.Conn, _ int) {
		br := bufio.NewReader(c)
		for {
			req, _, err := rawtest.ReadReq(br)
			if err != nil {
				return
			}
			if req.Method == http.MethodPost {
				posts.Add(1)
			}
			head := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
			if keepAlive != "" {
				head += "Keep-Alive: " + keepAlive + "\r\n"
			}
			if _, err := io.WriteString(c, head+"\r\nok"); err != nil {
				return
			}
		}
	})
}

// fakeClock is the pool's clock, moved by the test.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (f *fakeClock) Now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }
func (f *fakeClock) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func roundTripOK(t *testing.T, tr *Transport, method, url string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader("pay 1"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// TestRiskyRequestWithinKeepAliveBound: an upstream that says
// "Keep-Alive: timeout=1" gets a POST on a pooled connection only while
// that connection has been idle less than 750 ms (the clock is the
// pool's, moved by the test); past it the POST takes a fresh connection,
// while a GET still reuses the pooled one.
func TestRiskyRequestWithinKeepAliveBound(t *testing.T) {
	var posts atomic.Int64
	srv := keepAliveServer(t, "timeout=1, max=100", &posts)
	tr, _, traces := testTransport(t, nil)
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	base := client.NewHTTPTransport(client.HTTPOptions{Clock: clock.Now})
	t.Cleanup(base.CloseIdleConnections)
	tr.Base = base

	roundTripOK(t, tr, "GET", srv.URL()) // learns timeout=1
	clock.advance(500 * time.Millisecond)
	roundTripOK(t, tr, "POST", srv.URL())
	clock.advance(800 * time.Millisecond)
	roundTripOK(t, tr, "POST", srv.URL())
	clock.advance(800 * time.Millisecond)
	roundTripOK(t, tr, "GET", srv.URL())

	if got := srv.Conns(); got != 2 {
		t.Fatalf("%d connections, want 2 (the second POST alone on a fresh one)", got)
	}
	want := []struct {
		reused bool
		src    attempt.IdleBoundSource
	}{{false, attempt.IdleBoundNone}, {true, attempt.IdleBoundKeepAlive}, {false, attempt.IdleBoundKeepAlive}, {true, attempt.IdleBoundNone}}
	for i, tc := range *traces {
		a := tc.Attempts[0]
		if a.Reused != want[i].reused || a.IdleBound.Source != want[i].src {
			t.Errorf("request %d (%s): reused %v, bound %+v; want reused %v, source %s",
				i, tc.Method, a.Reused, a.IdleBound, want[i].reused, want[i].src)
		}
		if a.IdleBound.Source == attempt.IdleBoundKeepAlive && (a.IdleBound.Limit != 750*time.Millisecond || a.IdleBound.Seen != time.Second) {
			t.Errorf("request %d: bound %+v, want 750ms from 1s", i, a.IdleBound)
		}
	}
	if e := (*traces)[2].Explain(); !strings.Contains(e, "idle bound 750ms (keep-alive timeout 1s)") {
		t.Errorf("explain does not show the bound:\n%s", e)
	}
	if posts.Load() != 2 {
		t.Fatalf("%d POSTs executed, want 2", posts.Load())
	}
}

// TestRiskyRequestAfterCloseSeen: an upstream that closes idle
// connections after about a second without saying so. A pod's POST every
// 1.5 s: the first finds the pooled connection closed (the pool's check
// drops it), which teaches the pool; from then on the POSTs take fresh
// connections (bound 750 ms: half the 1.5 s after which the close was seen).
func TestRiskyRequestAfterCloseSeen(t *testing.T) {
	var posts atomic.Int64
	srv := keepAliveServer(t, "", &posts)
	tr, _, traces := testTransport(t, nil)
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	// The connections the pool dials, in order: the first is the one the
	// upstream closes while it is idle in the pool.
	dialed := make(chan net.Conn, 8)
	var d net.Dialer
	base := client.NewHTTPTransport(client.HTTPOptions{Clock: clock.Now,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err == nil {
				dialed <- c
			}
			return c, err
		}})
	t.Cleanup(base.CloseIdleConnections)
	tr.Base = base

	roundTripOK(t, tr, "POST", srv.URL())
	// The upstream's idle timer: it closes the connection.
	srv.Conn(0).Close()
	clock.advance(1500 * time.Millisecond)
	// The close is seen by the pool once the FIN is in (no timing
	// assumption: wait for it on the client's socket).
	rawtest.WaitPeerFIN(t, <-dialed)
	for range 3 {
		roundTripOK(t, tr, "POST", srv.URL())
		clock.advance(1500 * time.Millisecond)
	}
	if posts.Load() != 4 {
		t.Fatalf("%d POSTs executed, want 4", posts.Load())
	}
	for i, tc := range (*traces)[2:] {
		a := tc.Attempts[0]
		if a.Reused || a.IdleBound.Source != attempt.IdleBoundClose || a.IdleBound.Limit != 750*time.Millisecond {
			t.Errorf("POST %d: reused %v, bound %+v; want a fresh connection, bound 750ms from a close", i+2, a.Reused, a.IdleBound)
		}
	}
}

// finRacer is the witness of TestEndedBeforeAckIsNotSent: when armed, the
// snapshot the pool's liveness check takes first reads the live,
// established socket, then has the upstream close the connection and
// waits for its FIN to arrive, and returns the earlier reading: the
// upstream's close races the request, after the check and before the
// write, deterministically.
type finRacer struct {
	armed atomic.Bool
	close func()
}

func (f *finRacer) Snapshot(raw syscall.RawConn) (witness.Counters, error) {
	s, err := witness.TCPInfo{}.Snapshot(raw)
	if err != nil || !f.armed.CompareAndSwap(true, false) {
		return s, err
	}
	f.close()
	raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		for {
			if _, err := unix.Poll(fds, 5000); !errors.Is(err, unix.EINTR) {
				return
			}
		}
	})
	return s, nil
}

// TestEndedBeforeAckIsNotSent: the upstream closes the pooled connection
// (FIN) just as a POST is written on it. Its FIN acks none of the POST, its
// kernel resets the bytes: the witness proves the POST never reached it,
// so it is retried on a fresh connection and executed once.
func TestEndedBeforeAckIsNotSent(t *testing.T) {
	var posts atomic.Int64
	srv := keepAliveServer(t, "", &posts)
	tr, _, traces := testTransport(t, nil)
	fr := &finRacer{close: func() {
		srv.Conn(0).Close()
	}}
	tr.Witness = fr
	roundTripOK(t, tr, "GET", srv.URL())
	fr.armed.Store(true)
	req, _ := http.NewRequest("POST", srv.URL(), strings.NewReader("pay 1"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		a := (*traces)[1].Attempts[0]
		t.Fatalf("POST: %v\n%s\nbefore %+v\nafter %+v", err, (*traces)[1].Explain(), a.WitnessBefore, a.WitnessAfter)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if fr.armed.Load() {
		t.Fatal("the race was not run")
	}
	if posts.Load() != 1 {
		t.Fatalf("the POST was executed %d times", posts.Load())
	}
	tc := (*traces)[1]
	if len(tc.Attempts) != 2 {
		t.Fatalf("%d attempts, want 2:\n%s", len(tc.Attempts), tc.Explain())
	}
	a := tc.Attempts[0]
	if a.Evidence != engine.NotSent || !a.Upgraded || a.Proof != ProofEndedBeforeAck || !a.Reused {
		t.Fatalf("first attempt: evidence %s, upgraded %v, proof %s, reused %v\n%s", a.Evidence, a.Upgraded, a.Proof, a.Reused, tc.Explain())
	}
	if a.WitnessAfter.BytesSent == a.WitnessBefore.BytesSent || a.WitnessAfter.BytesAcked != a.WitnessBefore.BytesAcked {
		t.Fatalf("counters %+v -> %+v: want bytes sent, none acked", a.WitnessBefore, a.WitnessAfter)
	}
	if e := tc.Explain(); !strings.Contains(e, "the upstream's FIN acked none") {
		t.Errorf("explain does not show the proof:\n%s", e)
	}
}
