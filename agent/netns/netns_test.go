package netns_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent/netns"
	"github.com/egret-proxy/egret/internal/testenv"
)

func newNS(t *testing.T) *netns.NS {
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
