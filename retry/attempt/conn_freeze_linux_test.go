//go:build linux

package attempt

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/egret-proxy/egret/witness"
)

// enteredConn closes entered when its first Write starts.
type enteredConn struct {
	*net.TCPConn
	entered chan struct{}
}

func (c *enteredConn) Write(p []byte) (int, error) {
	select {
	case <-c.entered:
	default:
		close(c.entered)
	}
	return c.TCPConn.Write(p)
}

// freezePair returns a Conn on a real loopback connection, armed
// with the kernel witness, and its peer.
func freezePair(t *testing.T) (*Conn, *enteredConn, net.Conn) {
	t.Helper()
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
	peer := <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); peer.Close() })
	// Small buffers (no autotuning): a write of a few MiB stays in flight
	// until the peer reads, and the peer's reads take little time.
	if err := c.(*net.TCPConn).SetWriteBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if err := peer.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	ec := &enteredConn{TCPConn: c.(*net.TCPConn), entered: make(chan struct{})}
	raw, err := ec.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	wc := &Conn{Conn: ec, raw: raw}
	wc.Arm(witness.TCPInfo{})
	return wc, ec, peer
}

// TestFreezeWaitsForTheWriteInFlight: a write inside the kernel when the
// connection freezes is waited for; once it returns, the final snapshot is
// taken and accounts for every byte the write put in the socket.
func TestFreezeWaitsForTheWriteInFlight(t *testing.T) {
	wc, ec, peer := freezePair(t)
	const size = 1 << 20 // far more than the socket buffers hold
	wrote := make(chan error, 1)
	go func() {
		_, err := wc.Write(make([]byte, size))
		wrote <- err
	}()
	<-ec.entered
	frozen := make(chan struct{})
	go func() {
		wc.freeze()
		close(frozen)
	}()
	if _, err := io.CopyN(io.Discard, peer, size); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write: %v", err)
	}
	<-frozen
	snap, ok := wc.finalSnapshot()
	if !ok {
		t.Fatalf("no final snapshot: %v", wc.finalErr)
	}
	// The write returned once its last bytes were in the socket: some may
	// not have gone out yet when the snapshot was taken (9 runs in 30
	// under load), and the snapshot says so. Between sent and not sent it
	// accounts for every byte.
	if !snap.HasBytesSent || !snap.HasNotSentBytes || snap.BytesSent+snap.NotSentBytes < size {
		t.Fatalf("final snapshot: %d bytes sent (known %v), %d not sent (known %v); the write put %d in the socket",
			snap.BytesSent, snap.HasBytesSent, snap.NotSentBytes, snap.HasNotSentBytes, size)
	}
	if _, err := wc.Write([]byte("x")); err != ErrFrozen {
		t.Fatalf("write after freeze: %v, want ErrFrozen", err)
	}
}

// TestFreezeGivesUpOnAStuckWrite: a write stuck on a peer that reads
// nothing does not hold the freeze past its bound; the snapshot is given
// up (not guessed), and closing the connection ends the write.
func TestFreezeGivesUpOnAStuckWrite(t *testing.T) {
	wc, ec, _ := freezePair(t)
	wrote := make(chan error, 1)
	go func() {
		_, err := wc.Write(make([]byte, 4<<20))
		wrote <- err
	}()
	<-ec.entered
	start := time.Now()
	wc.freeze()
	if d := time.Since(start); d < freezeWait {
		t.Fatalf("freeze returned after %v, before its bound %v, with the write stuck", d, freezeWait)
	}
	if _, ok := wc.finalSnapshot(); ok || wc.finalErr == nil {
		t.Fatalf("a snapshot was taken with a write in flight (err %v)", wc.finalErr)
	}
	wc.Conn.Close()
	if err := <-wrote; err == nil {
		t.Fatal("the stuck write succeeded")
	}
}
