package netns_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent/netns"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

func newNS(t testing.TB) *netns.NS {
	t.Helper()
	testenv.RequireRoot(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "egret-t-" + hex.EncodeToString(b)
	ns, err := netns.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(filepath.Join(netns.Dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s left: %v", name, err)
		}
	})
	return ns
}

// A listener made in the namespace is reachable only from it; a socket
// made there keeps its namespace whichever goroutine uses it.
func TestListenAndDialInside(t *testing.T) {
	ns := newNS(t)
	host, _ := netns.Host().Inode()
	inside, _ := ns.Inode()
	if host == inside || inside == 0 {
		t.Fatalf("inodes host %d inside %d", host, inside)
	}
	ln, err := ns.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	// From the host namespace: nothing listens there.
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("reached the namespace's listener from the host")
	}
	d := &netns.Dialer{NS: ns, Mark: 0x1234, Timeout: time.Second}
	c, err := d.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil || string(buf) != "hi" {
		t.Fatalf("read %q %v", buf, err)
	}
	rc, _ := c.(syscall.Conn).SyscallConn()
	var mark int
	rc.Control(func(fd uintptr) { mark, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) })
	if mark != 0x1234 {
		t.Fatalf("mark = %#x", mark)
	}
	// The calling thread is back home.
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("a later host dial landed in the namespace")
	}
}

func TestOpenRefusesNonNamespace(t *testing.T) {
	if _, err := netns.Open("/etc/hostname"); !errors.Is(err, netns.ErrNetns) {
		t.Fatalf("err = %v", err)
	}
	if _, err := netns.Open("/nonexistent"); !errors.Is(err, netns.ErrNetns) {
		t.Fatalf("err = %v", err)
	}
	if h, err := netns.Open(""); err != nil || !h.IsHost() {
		t.Fatalf("empty path: %v %v", h, err)
	}
}

// BenchmarkDial compares a dial from the agent's namespace with one made
// inside another namespace (a goroutine locked to a thread, two setns).
func BenchmarkDial(b *testing.B) {
	testenv.RequireRoot(b)
	for _, inside := range []bool{false, true} {
		name := "host"
		if inside {
			name = "netns"
		}
		b.Run(name, func(b *testing.B) {
			ns := netns.Host()
			if inside {
				ns = newNS(b)
			}
			ln, err := ns.Listen(context.Background(), "tcp4", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
			d := &netns.Dialer{NS: ns}
			b.ResetTimer()
			for range b.N {
				c, err := d.DialContext(context.Background(), "tcp4", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

// Dial errors from inside look like the runtime's own: refused is
// ECONNREFUSED, a timeout is a net.Error with Timeout(), a cancelled
// context is the context's error.
func TestDialErrorsInside(t *testing.T) {
	ns := newNS(t)
	d := &netns.Dialer{NS: ns, Timeout: 200 * time.Millisecond}
	_, err := d.DialContext(context.Background(), "tcp", "127.0.0.1:1")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("refused: %v", err)
	}
	// The namespace has only a loopback: add a route that leads nowhere
	// so the SYN goes out and is never answered.
	err = ns.Do(func() error {
		return exec.Command("ip", "route", "add", "blackhole", "192.0.2.0/24").Run()
	})
	if err != nil {
		t.Fatalf("ip route: %v", err)
	}
	// A blackhole route fails at once (EINVAL/unreachable); both must be
	// errors, not hangs.
	start := time.Now()
	_, err = d.DialContext(context.Background(), "tcp", "192.0.2.1:80")
	if err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("blackhole: %v after %v", err, time.Since(start))
	}
	// A listener that never accepts, with a full backlog, leaves the
	// connect pending: the timeout and the context both end it. Its
	// backlog is 1 (made by hand: Go's listen asks for somaxconn, 4096,
	// which a fast machine's dials fill only after the loop's end).
	ln := tinyBacklogListener(t, ns)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var last error
	for range 64 {
		c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			last = err
			break
		}
		conns = append(conns, c)
	}
	var ne net.Error
	if last == nil || !(errors.As(last, &ne) && ne.Timeout() || errors.Is(last, context.DeadlineExceeded)) {
		t.Fatalf("pending connect ended with %v", last)
	}
}

// tinyBacklogListener listens on 127.0.0.1 inside ns with a backlog of 1.
func tinyBacklogListener(t *testing.T, ns *netns.NS) net.Listener {
	t.Helper()
	var ln net.Listener
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), "tiny-backlog")
		defer f.Close()
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			return err
		}
		if err := unix.Listen(fd, 1); err != nil {
			return err
		}
		ln, err = net.FileListener(f)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
