package rawsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a loopback TCP connection: the dialled end
// (a *net.TCPConn) and the accepted one.
func pair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(ch)
			return
		}
		ch <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, ok := <-ch
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// shape is what a caller can tell from an I/O result.
type shape struct {
	n                                   int
	nilErr, eof, closed, deadline, tout bool
	reset, pipe                         bool
	op, net, syscall                    string
}

func shapeOf(n int, err error) shape {
	s := shape{n: n, nilErr: err == nil, eof: err == io.EOF,
		closed: errors.Is(err, net.ErrClosed), deadline: errors.Is(err, os.ErrDeadlineExceeded),
		reset: errors.Is(err, syscall.ECONNRESET), pipe: errors.Is(err, syscall.EPIPE)}
	var ne net.Error
	s.tout = errors.As(err, &ne) && ne.Timeout()
	var oe *net.OpError
	if errors.As(err, &oe) {
		s.op, s.net = oe.Op, oe.Net
	}
	var se *os.SyscallError
	if errors.As(err, &se) {
		s.syscall = se.Syscall
	}
	return s
}

// differential runs fn on a plain connection and on a wrapped one and
// wants the same shape from both.
func differential(t *testing.T, name string, fn func(t *testing.T, c net.Conn, peer *net.TCPConn) (int, error)) {
	t.Run(name, func(t *testing.T) {
		c1, p1 := pair(t)
		want := shapeOf(fn(t, c1, p1))
		c2, p2 := pair(t)
		w := Wrap(c2)
		if runtime.GOOS == "linux" {
			if _, ok := w.(*Conn); !ok {
				t.Fatalf("Wrap gave %T", w)
			}
		}
		got := shapeOf(fn(t, w, p2))
		if got != want {
			t.Fatalf("wrapped %+v\nnet.Conn %+v", got, want)
		}
	})
}

func TestSameAsNetConn(t *testing.T) {
	differential(t, "data then EOF", func(t *testing.T, c net.Conn, peer *net.TCPConn) (int, error) {
		peer.Write([]byte("hello"))
		peer.Close()
		b, err := io.ReadAll(c)
		if string(b) != "hello" {
			t.Fatalf("read %q", b)
		}
		if err != nil {
			return len(b), err
		}
		return c.Read(make([]byte, 8))
	})
	differential(t, "deadline already passed", func(t *testing.T, c net.Conn, peer *net.TCPConn) (int, error) {
		c.SetReadDeadline(time.Unix(1, 0))
		return c.Read(make([]byte, 8))
	})
	differential(t, "deadline passes while waiting", func(t *testing.T, c net.Conn, peer *net.TCPConn) (int, error) {
		c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
		return c.Read(make([]byte, 8))
	})
	differential(t, "read after Close", func(t *testing.T, c net.Conn, peer *net.TCPConn) (int, error) {
		c.Close()
		return c.Read(make([]byte, 8))
	})
	differential(t, "Close during a read", func(t *testing.T, c net.Conn, peer *net.TCPConn) (int, error) {
		time.AfterFunc(30*time.Millisecond, func() { c.Close() })
		return c.Read(make([]byte, 8))
	})
	differential(t, "read after the peer's reset", func(t *testing.T, c net.Conn, peer *net.TCPConn) (int, error) {
		peer.SetLinger(0)
		peer.Close()
		waitSocket(t, c, pollRDHUP) // the reset is in c's socket
		return c.Read(make([]byte, 8))
	})
	differential(t, "write after the peer's reset", func(t *testing.T, c net.Conn, peer *net.TCPConn) (int, error) {
		peer.SetLinger(0)
		peer.Close()
		waitSocket(t, c, pollRDHUP)
		return c.Write([]byte("x"))
	})
	differential(t, "write after Close", func(t *testing.T, c net.Conn, peer *net.TCPConn) (int, error) {
		c.Close()
		return c.Write([]byte("x"))
	})
	differential(t, "write deadline with a peer that does not read", func(t *testing.T, c net.Conn, peer *net.TCPConn) (int, error) {
		c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := c.Write(make([]byte, 64<<20))
		if n >= 64<<20 {
			t.Fatalf("wrote all 64 MiB to a peer that does not read")
		}
		// How much left depends on the buffers (and on a loaded machine
		// none may, the deadline passing before the first call).
		return 0, err
	})
	differential(t, "empty read and write", func(t *testing.T, c net.Conn, peer *net.TCPConn) (int, error) {
		if n, err := c.Write(nil); n != 0 || err != nil {
			return n, err
		}
		return c.Read(nil)
	})
}

// TestLargeWriteAndConcurrentRead: a write much larger than the socket
// buffers waits for the peer (EAGAIN and readiness) and delivers every
// byte in order, while another goroutine reads the same connection.
func TestLargeWriteAndConcurrentRead(t *testing.T) {
	c, peer := pair(t)
	w := Wrap(c)
	data := make([]byte, 16<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	var got bytes.Buffer
	go func() { // the peer echoes a little and drains the rest slowly
		defer wg.Done()
		peer.Write([]byte("echo"))
		buf := make([]byte, 32<<10)
		for got.Len() < len(data) {
			n, err := peer.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				return
			}
			if got.Len() < 1<<20 {
				time.Sleep(time.Millisecond) // not synchronisation: the slow drain that fills the writer's window
			}
		}
	}()
	var echo []byte
	go func() {
		defer wg.Done()
		b := make([]byte, 4)
		n, err := io.ReadFull(w, b)
		if err != nil {
			t.Errorf("concurrent read: %d, %v", n, err)
		}
		echo = b
	}()
	n, err := w.Write(data)
	if n != len(data) || err != nil {
		t.Fatalf("wrote %d, %v", n, err)
	}
	wg.Wait()
	if string(echo) != "echo" || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("echo %q; %d bytes arrived, equal %v", echo, got.Len(), bytes.Equal(got.Bytes(), data))
	}
}

func TestWrapLeavesOtherConns(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if Wrap(a) != a {
		t.Fatal("a pipe was wrapped")
	}
}

// TestWrappedKeepsTCPConn: what callers reach through interfaces (the
// socket, half-close, linger) is still there.
func TestWrappedKeepsTCPConn(t *testing.T) {
	c, peer := pair(t)
	w := Wrap(c)
	if _, ok := w.(syscall.Conn); !ok {
		t.Fatal("no SyscallConn")
	}
	if _, ok := w.(interface{ SetLinger(int) error }); !ok {
		t.Fatal("no SetLinger")
	}
	cw, ok := w.(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("no CloseWrite")
	}
	cw.CloseWrite()
	if _, err := peer.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("peer read %v after CloseWrite", err)
	}
}

func TestRead(t *testing.T) {
	c, peer := pair(t)
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var rerr error
	buf := make([]byte, 8)
	read := func() {
		if err := rc.Control(func(fd uintptr) { n, rerr = Read(fd, buf) }); err != nil {
			t.Fatal(err)
		}
	}
	read()
	if rerr != syscall.EAGAIN {
		t.Fatalf("empty socket: %d, %v; want EAGAIN", n, rerr)
	}
	peer.Write([]byte("abc"))
	waitSocket(t, c, pollIn)
	read()
	if n != 3 || rerr != nil || string(buf[:3]) != "abc" {
		t.Fatalf("read %d %q, %v", n, buf[:n], rerr)
	}
	peer.Close()
	waitSocket(t, c, pollRDHUP)
	read()
	if n != 0 || rerr != nil {
		t.Fatalf("at the end: %d, %v; want 0, nil", n, rerr)
	}
}

// TestNoAllocations: a read or write that succeeds allocates nothing.
func TestNoAllocations(t *testing.T) {
	c, peer := pair(t)
	w := Wrap(c)
	msg := []byte("ping")
	buf := make([]byte, 16)
	n := testing.AllocsPerRun(100, func() {
		if _, err := w.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, buf[:4]); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(w, buf[:4]); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Fatalf("%.1f allocations per write and read", n)
	}
}
