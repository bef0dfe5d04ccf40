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
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy/witness"
)

// peerState peeks at an idle socket once (see peeker).
func peerState(raw syscall.RawConn) (fin, pending bool) { return newPeeker().state(raw) }

func TestPeerClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer := <-accepted
	wc := newWitnessConn(c)
	pc := &h1Conn{wc: wc}
	if fin, pending := peerState(wc.raw); fin || pending || pc.stale() {
		t.Fatal("a live idle connection looks closed")
	}
	peer.Write([]byte("HTTP/1.1 408 Request Timeout\r\n\r\n"))
	pc.tls = true // bytes on a TLS connection may be a session ticket; on plain HTTP/1.1 they are an unsolicited answer
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, pending := peerState(wc.raw); pending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pending bytes never seen")
		}
	}
	if pc.stale() {
		t.Fatal("refused a TLS connection for pending bytes")
	}
	if !(&h1Conn{wc: wc}).stale() {
		t.Fatal("an unsolicited answer on an idle plain connection was not refused")
	}
	if _, err := io.ReadFull(c, make([]byte, len("HTTP/1.1 408 Request Timeout\r\n\r\n"))); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	deadline := time.Now().Add(2 * time.Second)
	for fin, _ := peerState(wc.raw); !fin; fin, _ = peerState(wc.raw) {
		if time.Now().After(deadline) {
			t.Fatal("the peer's close was never seen")
		}
		time.Sleep(time.Millisecond)
	}
	if !pc.stale() {
		t.Fatal("a connection the peer closed is not stale under TLS")
	}
	if !(&h1Conn{wc: wc}).stale() {
		t.Fatal("a connection the peer closed is not stale")
	}
}

// lazyReader delays every read after the first on a connection, so that a
// pool that learns of an upstream's close only by reading (as net/http's
// idle read loop does) learns of it late: the window in which a pooled
// connection is reused just as the upstream closes it. HTTPTransport's pool
// peeks at the socket instead, which the delay does not touch.
type lazyReader struct {
	net.Conn
	reads atomic.Int64
}

func (l *lazyReader) Read(p []byte) (int, error) {
	if l.reads.Add(1) > 1 {
		time.Sleep(300 * time.Millisecond)
	}
	return l.Conn.Read(p)
}

func (l *lazyReader) NetConn() net.Conn { return l.Conn }

// lazyTransport is an HTTPTransport whose connections are lazyReaders.
func lazyTransport(t *testing.T) *HTTPTransport {
	base := NewHTTPTransport(HTTPOptions{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
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
		srv := newRawServer(t, func(c net.Conn, n int) {
			br := bufio.NewReader(c)
			for {
				req, _, err := readReq(br)
				if err != nil {
					return
				}
				if req.Method == "POST" {
					executed.Add(1)
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				if n == 1 {
					time.Sleep(20 * time.Millisecond)
					return // close the idle connection (FIN)
				}
			}
		})
		base := lazyTransport(t)
		tr, _, _ := testTransport(t, nil)
		tr.Base = base
		tr.Witness = w
		resp, err := tr.RoundTrip(get(t, srv.url()))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		time.Sleep(60 * time.Millisecond) // the upstream has closed the pooled connection
		resp, err = tr.RoundTrip(post(t, srv.url(), strings.Repeat("p", 100)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		trc, _ := TraceOf(resp)
		if resp.StatusCode != 200 || len(trc.Attempts) != 1 || trc.Attempts[0].Evidence != engine.ResponseReceived {
			t.Fatalf("witness %v: status %d, attempts %+v", w, resp.StatusCode, trc.Attempts)
		}
		if executed.Load() != 1 || srv.conns.Load() != 2 {
			t.Fatalf("witness %v: executed %d on %d connections", w, executed.Load(), srv.conns.Load())
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
	resetDone := make(chan struct{})
	srv := newRawServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		for {
			if _, _, err := readReq(br); err != nil {
				return
			}
			if arrivals.Add(1) == 1 {
				io.WriteString(c, "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n")
				time.Sleep(20 * time.Millisecond)
				reset(c) // the idle connection, while the client waits out Retry-After
				close(resetDone)
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	base := lazyTransport(t)
	tr, _, _ := testTransport(t, nil)
	tr.Base = base
	tr.Witness = witness.TCPInfo{}
	tr.Sleep = func(ctx context.Context, d time.Duration) error {
		<-resetDone // the Retry-After wait ends just after the upstream's reset
		time.Sleep(20 * time.Millisecond)
		return ctx.Err()
	}
	req, err := http.NewRequest(http.MethodDelete, srv.url(), nil)
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
	if srv.conns.Load() != 2 {
		t.Fatalf("%d connections: the reset connection was not reused (the race did not happen)", srv.conns.Load())
	}
	dispatches := 0
	for _, a := range trc.Attempts {
		dispatches += 1 + a.HiddenRetries
	}
	if got := arrivals.Load(); int64(dispatches) != got {
		t.Fatalf("dispatches counted %d (attempts %+v), upstream saw %d", dispatches, trc.Attempts, got)
	}
}

// TestPeekAllocatesNothing: every reuse of a pooled connection is peeked
// at; that must not cost an allocation.
func TestPeekAllocatesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc := &h1Conn{wc: newWitnessConn(c)}
	if pc.stale() {
		t.Fatal("a live idle connection looks stale")
	}
	if allocs := testing.AllocsPerRun(100, func() { pc.stale() }); allocs != 0 {
		t.Fatalf("%.1f allocations per peek", allocs)
	}
}
