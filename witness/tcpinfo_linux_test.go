//go:build linux

package witness

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

func rawOf(t *testing.T, c net.Conn) syscall.RawConn {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestTCPInfoCountsBytesSentOnlyAfterAWrite(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	raw := rawOf(t, c)
	var w TCPInfo
	before, err := w.Snapshot(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !before.HasBytesSent || !before.HasDataSegsOut || before.Source != "tcp_info" {
		t.Fatalf("counters not readable: %+v", before)
	}
	// Not synchronisation: time passes with no write; the counters must
	// not move.
	time.Sleep(10 * time.Millisecond)
	idle, err := w.Snapshot(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !NoByteLeft(before, idle) {
		t.Fatalf("counters moved without a write: %+v -> %+v", before, idle)
	}
	msg := []byte("POST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	var after Counters
	// Polls: the peer's ACK arrives in the kernel with no event a socket
	// user can wait on; TCP_INFO shows it.
	testenv.Poll(2*time.Second, func() bool {
		if after, err = w.Snapshot(raw); err != nil {
			t.Fatal(err)
		}
		return after.BytesAcked-before.BytesAcked >= uint64(len(msg))
	})
	if NoByteLeft(before, after) {
		t.Fatalf("a write left no trace: %+v -> %+v", before, after)
	}
	if d := after.BytesSent - before.BytesSent; d != uint64(len(msg)) {
		t.Fatalf("bytes sent moved by %d, want %d", d, len(msg))
	}
	if after.DataSegsOut <= before.DataSegsOut {
		t.Fatalf("data segments did not move: %d -> %d", before.DataSegsOut, after.DataSegsOut)
	}
	c.Close()
	if n := <-got; n != int64(len(msg)) {
		t.Fatalf("peer read %d bytes", n)
	}
	if _, err := w.Snapshot(raw); err == nil {
		t.Fatal("snapshot of a closed socket succeeded")
	}
}

func TestTCPInfoUnsupportedOnUDP(t *testing.T) {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (TCPInfo{}).Snapshot(raw); err == nil {
		t.Fatal("TCP_INFO on a UDP socket succeeded")
	}
}

// TestTCPInfoSnapshotAllocatesNothing: a snapshot is taken on every
// attempt; it must not cost the proxy's hot path an allocation.
func TestTCPInfoSnapshotAllocatesNothing(t *testing.T) {
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
	raw := rawOf(t, c)
	var w TCPInfo
	if allocs := testing.AllocsPerRun(100, func() {
		if _, err := w.Snapshot(raw); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("%.1f allocations per snapshot", allocs)
	}
}
