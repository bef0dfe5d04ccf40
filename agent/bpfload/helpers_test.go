package bpfload_test

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// env is one loaded egret with its own pin directory and cgroup subtree.
// self is the cgroup standing in for egret's own: its sockets (listeners,
// upstream dials) are made there.
type env struct {
	l    *bpfload.Loader
	pin  string
	cg   *bpftest.Cgroups
	self string
	upNS netns.NsHandle // upstream namespace, see env.upstream
}

func setup(t testing.TB) *env {
	t.Helper()
	return setupWith(t, bpfload.Options{})
}

// setupWith is setup with Load options (PinDir is always a fresh one).
func setupWith(t testing.TB, opts bpfload.Options) *env {
	t.Helper()
	testenv.RequireRoot(t)
	e := &env{pin: filepath.Join(bpfload.BPFFSRoot, bpftest.RandName())}
	var ids []uint32
	// Registered first, so it runs after every other cleanup.
	t.Cleanup(func() {
		cgs := []string{}
		if e.cg != nil {
			cgs = append(cgs, e.cg.Top)
		}
		if err := bpftest.NothingLeft(e.pin, cgs, nil, ids); err != nil {
			t.Error(err)
		}
		// Reported above; not left on the host either (a Load or
		// SetAlive that failed leaves its pins).
		os.RemoveAll(e.pin)
	})
	e.cg = bpftest.NewCgroups(t)
	opts.PinDir = e.pin
	l, err := bpfload.Load(opts)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	e.l = l
	if err := l.SetAlive(); err != nil {
		t.Fatalf("SetAlive: %v", err)
	}
	for _, id := range l.ProgramIDs() {
		ids = append(ids, uint32(id))
	}
	t.Cleanup(func() {
		if err := e.l.Remove(); err != nil {
			t.Errorf("Remove: %v", err)
		}
		e.l.Close()
	})
	e.self = e.cg.Sub(t, "egret")
	if err := l.AttachSelf(e.self); err != nil {
		t.Fatalf("AttachSelf: %v", err)
	}
	return e
}

type pod struct {
	cg string
	ns netns.NsHandle
	id uint64
}

// pod makes a cgroup + netns pair (lo up, extra lo addresses) attached with cfg.
func (e *env) pod(t testing.TB, name string, cfg bpfload.PodConfig, loAddrs ...string) pod {
	t.Helper()
	p := pod{cg: e.cg.Sub(t, name), ns: bpftest.NewNetns(t, loAddrs...)}
	id, err := e.l.AttachPod(p.cg, cfg)
	if err != nil {
		t.Fatalf("AttachPod: %v", err)
	}
	p.id = id
	return p
}

func family(addr string) int {
	if netip.MustParseAddrPort(addr).Addr().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// listen makes a TCP listener on addr inside ns, created in cgroup cg.
func listen(t testing.TB, cg string, ns netns.NsHandle, addr string) *net.TCPListener {
	t.Helper()
	f, res := bpftest.Socket(t, cg, ns, bpftest.Op{Kind: "listen", Family: family(addr), Addr: addr})
	if res.Err != "" {
		t.Fatalf("listen %s: %s", addr, res.Err)
	}
	return bpftest.Listener(t, f)
}

// dial connects from a socket made in cgroup cg inside ns.
func dial(t testing.TB, cg string, ns netns.NsHandle, op bpftest.Op) (net.Conn, bpftest.Result) {
	t.Helper()
	op.Kind = "dial"
	if op.Family == 0 {
		op.Family = family(op.Addr)
	}
	f, res := bpftest.Socket(t, cg, ns, op)
	if res.Err != "" {
		t.Fatalf("dial %+v: %s", op, res.Err)
	}
	return bpftest.Conn(t, f), res
}

// accept waits up to d for a connection on l; nil if none came.
func accept(t testing.TB, l *net.TCPListener, d time.Duration) *net.TCPConn {
	t.Helper()
	_ = l.SetDeadline(time.Now().Add(d))
	c, err := l.AcceptTCP()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		t.Fatalf("accept: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func rawConn(t testing.TB, c syscall.Conn) syscall.RawConn {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

func origDst(t testing.TB, c *net.TCPConn) netip.AddrPort {
	t.Helper()
	ap, err := bpfload.OriginalDst(rawConn(t, c))
	if err != nil {
		t.Fatalf("OriginalDst: %v", err)
	}
	return ap
}

// roundTrip checks bytes flow from client to server.
func roundTrip(t testing.TB, client net.Conn, server net.Conn) {
	t.Helper()
	msg := []byte("hello through egret")
	if _, err := client.Write(msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	_ = server.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.ReadFull(server, buf); err != nil {
		t.Fatal(err)
	}
	if string(buf) != string(msg) {
		t.Fatalf("got %q", buf)
	}
}

// expectAt checks that the next connection arrives at want and not at the
// others.
func expectAt(t testing.TB, want *net.TCPListener, others ...*net.TCPListener) *net.TCPConn {
	t.Helper()
	c := accept(t, want, 3*time.Second)
	if c == nil {
		t.Fatalf("no connection at %s", want.Addr())
	}
	for _, o := range others {
		if oc := accept(t, o, 100*time.Millisecond); oc != nil {
			t.Fatalf("unexpected connection at %s from %s", o.Addr(), oc.RemoteAddr())
		}
	}
	return c
}
