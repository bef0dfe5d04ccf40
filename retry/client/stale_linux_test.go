//go:build linux

package client

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
	"github.com/egret-proxy/egret/witness"
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
	wc := attempt.NewConn(c)
	pc := &h1Conn{wc: wc}
	if fin, pending := peerState(wc.Raw()); fin || pending || pc.stale() {
		t.Fatal("a live idle connection looks closed")
	}
	peer.Write([]byte("HTTP/1.1 408 Request Timeout\r\n\r\n"))
	pc.tls = true // bytes on a TLS connection may be a session ticket; on plain HTTP/1.1 they are an unsolicited answer
	rawtest.WaitPoll(t, c, unix.POLLIN, "the peer's bytes")
	if _, pending := peerState(wc.Raw()); !pending {
		t.Fatal("pending bytes not seen")
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
	rawtest.WaitPeerFIN(t, c)
	if fin, _ := peerState(wc.Raw()); !fin {
		t.Fatal("the peer's close not seen")
	}
	if !pc.stale() {
		t.Fatal("a connection the peer closed is not stale under TLS")
	}
	if !(&h1Conn{wc: wc}).stale() {
		t.Fatal("a connection the peer closed is not stale")
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
	pc := &h1Conn{wc: attempt.NewConn(c)}
	if pc.stale() {
		t.Fatal("a live idle connection looks stale")
	}
	if allocs := testing.AllocsPerRun(100, func() { pc.stale() }); allocs != 0 {
		t.Fatalf("%.1f allocations per peek", allocs)
	}
}

// pairConn returns a client connection wrapped for the witness and armed
// with w, and its server side.
func pairConn(t *testing.T, w witness.Witness) (*attempt.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); peer.Close() })
	wc := attempt.NewConn(c)
	wc.Arm(w)
	return wc, peer
}

// waitCheck polls the idle check until it answers want: the witness's
// counters (what the check reads) move with no event to wait on.
func waitCheck(t *testing.T, pc *h1Conn, want bool, what string) {
	t.Helper()
	var stale, decided bool
	testenv.Poll(2*time.Second, func() bool {
		stale, decided = pc.wc.CheckIdle(pc.tls)
		return !decided || stale == want
	})
	if !decided {
		t.Fatalf("%s: the witness's snapshot did not decide", what)
	}
	if stale != want {
		t.Fatalf("%s: stale %v, want %v", what, stale, want)
	}
}

// With a witness, the pool's check of an idle connection is the witness's
// snapshot (state and bytes received against bytes read), not a peek; it
// sees what the peek sees.
func TestIdleCheckBySnapshot(t *testing.T) {
	w := &rawtest.CountingWitness{}
	wc, peer := pairConn(t, w)
	pc := &h1Conn{wc: wc}
	if pc.stale() {
		t.Fatal("a live idle connection looks stale")
	}
	if pc.peek != nil {
		t.Fatal("the check peeked although the witness's snapshot could tell")
	}
	// A response read whole leaves nothing pending.
	answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	io.WriteString(peer, answer)
	if _, err := io.ReadFull(wc, make([]byte, len(answer))); err != nil {
		t.Fatal(err)
	}
	waitCheck(t, pc, false, "after a response read whole")
	// Bytes nobody asked for: stale on plain HTTP, not under TLS.
	io.WriteString(peer, "HTTP/1.1 408 Request Timeout\r\n\r\n")
	waitCheck(t, pc, true, "unsolicited bytes")
	pc.tls = true
	waitCheck(t, pc, false, "unsolicited bytes under TLS")
	// The peer's close: stale either way.
	peer.Close()
	waitCheck(t, pc, true, "peer closed, TLS")
	pc.tls = false
	waitCheck(t, pc, true, "peer closed")
	if pc.peek != nil {
		t.Fatal("the check peeked")
	}

	// A reset.
	wc2, peer2 := pairConn(t, w)
	pc2 := &h1Conn{wc: wc2}
	rawtest.Reset(peer2)
	waitCheck(t, pc2, true, "peer reset")

	// Without a witness it peeks.
	wc3, _ := pairConn(t, nil)
	pc3 := &h1Conn{wc: wc3}
	if pc3.stale() || pc3.peek == nil {
		t.Fatal("without a witness the check must peek")
	}
}

// The idle check's snapshot serves as the next request's "before" once,
// only for the witness that took it, and only while nothing was written.
func TestFreshSnapshotTakenOnce(t *testing.T) {
	w := &rawtest.CountingWitness{}
	wc, peer := pairConn(t, w)
	if stale, decided := wc.CheckIdle(false); stale || !decided {
		t.Fatalf("stale %v decided %v", stale, decided)
	}
	if _, ok := wc.TakeFresh(witness.TCPInfo{}); ok {
		t.Fatal("a snapshot taken by another witness was handed out")
	}
	wc.CheckIdle(false)
	b, ok := wc.TakeFresh(w)
	if !ok || !b.HasBytesSent || b.State != witness.StateEstablished {
		t.Fatalf("fresh snapshot %+v %v", b, ok)
	}
	if _, ok := wc.TakeFresh(w); ok {
		t.Fatal("the fresh snapshot was handed out twice")
	}
	wc.CheckIdle(false)
	if _, err := wc.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if _, ok := wc.TakeFresh(w); ok {
		t.Fatal("a snapshot older than a write was handed out")
	}
	peer.Close()
}
