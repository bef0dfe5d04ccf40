//go:build linux

package retry

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/client"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
	"github.com/egret-proxy/egret/witness"
)

// lazyReader delays every read after the first on a connection, so that a
// pool that learns of an upstream's close only by reading (as net/http's
// idle read loop does) learns of it late: the window in which a pooled
// connection is reused just as the upstream closes it. client.HTTPTransport's pool
// peeks at the socket instead, which the delay does not touch.
type lazyReader struct {
	net.Conn
	reads atomic.Int64
}

func (l *lazyReader) Read(p []byte) (int, error) {
	if l.reads.Add(1) > 1 {
		time.Sleep(300 * time.Millisecond) // not synchronisation: the delay this reader exists to make
	}
	return l.Conn.Read(p)
}

func (l *lazyReader) NetConn() net.Conn { return l.Conn }

// lazyTransport is a client.HTTPTransport whose connections are lazyReaders; each
// connection it dials is also sent on dialed, if not nil.
func lazyTransport(t *testing.T, dialed chan<- net.Conn) *client.HTTPTransport {
	base := client.NewHTTPTransport(client.HTTPOptions{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if dialed != nil {
			dialed <- c
		}
		return &lazyReader{Conn: c}, nil
	}})
	t.Cleanup(base.CloseIdleConnections)
	return base
}

// TestStalePooledConnectionPOSTIsNotSent: the upstream closes an idle
// keep-alive connection just before a POST would reuse it. Writing the POST
// there would make it ambiguous; the pool finds the close before it hands
// the connection out, and the POST goes out once, on a new connection, in
// one attempt. With and without a witness: the check is the pool's own.
func TestStalePooledConnectionPOSTIsNotSent(t *testing.T) {
	for _, w := range []witness.Witness{nil, witness.TCPInfo{}} {
		var executed atomic.Int64
		// idle: the client has the connection back in its pool; closed:
		// the upstream has closed it.
		idle, closed := make(chan struct{}), make(chan struct{})
		srv := rawtest.NewServer(t, func(c net.Conn, n int) {
			br := bufio.NewReader(c)
			for {
				req, _, err := rawtest.ReadReq(br)
				if err != nil {
					return
				}
				if req.Method == "POST" {
					executed.Add(1)
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				if n == 1 {
					<-idle
					c.Close() // the idle connection (FIN)
					close(closed)
					return
				}
			}
		})
		dialed := make(chan net.Conn, 2)
		base := lazyTransport(t, dialed)
		tr, _, _ := testTransport(t, nil)
		tr.Base = base
		tr.Witness = w
		resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		close(idle)
		<-closed // the upstream has closed the pooled connection
		rawtest.WaitPeerFIN(t, <-dialed)
		resp, err = tr.RoundTrip(rawtest.Post(t, srv.URL(), strings.Repeat("p", 100)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		trc, _ := TraceOf(resp)
		if resp.StatusCode != 200 || len(trc.Attempts) != 1 || trc.Attempts[0].Evidence != engine.ResponseReceived {
			t.Fatalf("witness %v: status %d, attempts %+v", w, resp.StatusCode, trc.Attempts)
		}
		if executed.Load() != 1 || srv.Conns() != 2 {
			t.Fatalf("witness %v: executed %d on %d connections", w, executed.Load(), srv.Conns())
		}
	}
}

// TestNothingWrittenReplayIsNotAHiddenRetry: a body-less DELETE gets 429
// with Retry-After; during the wait the upstream resets the idle
// keep-alive connection, and net/http has not noticed when the retry
// reuses it. The retry's write fails before a byte leaves (the kernel
// already holds the reset) and net/http replays it on a new connection by
// itself: one dispatch, not two. The upstream saw two requests, and two
// attempts is what the trace must say (Egret-Attempts adds HiddenRetries).
func TestNothingWrittenReplayIsNotAHiddenRetry(t *testing.T) {
	var arrivals atomic.Int64
	waiting, resetDone := make(chan struct{}), make(chan struct{})
	srv := rawtest.NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		for {
			if _, _, err := rawtest.ReadReq(br); err != nil {
				return
			}
			if arrivals.Add(1) == 1 {
				io.WriteString(c, "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n")
				<-waiting
				rawtest.Reset(c) // the idle connection, while the client waits out Retry-After
				close(resetDone)
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	dialed := make(chan net.Conn, 2)
	base := lazyTransport(t, dialed)
	tr, _, _ := testTransport(t, nil)
	tr.Base = base
	tr.Witness = witness.TCPInfo{}
	tr.Sleep = func(ctx context.Context, d time.Duration) error {
		close(waiting)
		<-resetDone                      // the Retry-After wait ends just after the upstream's reset
		rawtest.WaitPeerFIN(t, <-dialed) // the RST is in the client's socket
		return ctx.Err()
	}
	req, err := http.NewRequest(http.MethodDelete, srv.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	trc, _ := TraceOf(resp)
	if resp.StatusCode != 200 || len(trc.Attempts) != 2 {
		t.Fatalf("status %d, attempts %+v", resp.StatusCode, trc.Attempts)
	}
	if srv.Conns() != 2 {
		t.Fatalf("%d connections: the reset connection was not reused (the race did not happen)", srv.Conns())
	}
	dispatches := 0
	for _, a := range trc.Attempts {
		dispatches += 1 + a.HiddenRetries
	}
	if got := arrivals.Load(); int64(dispatches) != got {
		t.Fatalf("dispatches counted %d (attempts %+v), upstream saw %d", dispatches, trc.Attempts, got)
	}
}

// A keep-alive request through the pool with a witness costs one snapshot
// for its "before" (the pool's check), not a peek and a snapshot; the
// first request on a new connection uses the birth snapshot.
func TestReusedConnectionOneSnapshot(t *testing.T) {
	srv := rawtest.NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		for {
			if _, _, err := rawtest.ReadReq(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	w := &rawtest.CountingWitness{}
	tr, _, _ := testTransport(t, nil)
	tr.Witness = w
	for i := range 5 {
		before := w.Snapshots()
		resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := w.Snapshots() - before; got != 1 {
			t.Fatalf("request %d: %d snapshots, want 1", i, got)
		}
	}
	if srv.Conns() != 1 {
		t.Fatalf("%d connections", srv.Conns())
	}
}
