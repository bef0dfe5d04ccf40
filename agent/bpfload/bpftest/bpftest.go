// Package bpftest builds "pods" for root tests of egret's eBPF programs on
// a real kernel: a cgroup v2 under /sys/fs/cgroup/unified, a network
// namespace, and sockets created inside both.
//
// A socket's cgroup is fixed when it is created and its network namespace
// too, so sockets are made by a short-lived child process (the test binary
// re-executed) that is cloned straight into the cgroup (CLONE_INTO_CGROUP),
// enters the namespace on its locked thread, makes the socket and passes
// the descriptor back over a unix socket. The test then uses the socket as
// an ordinary *os.File / net.Conn. A test binary using this package must
// call RunChildIfRequested first thing in TestMain.
package bpftest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// Prefix starts the name of every cgroup, netns pin and bpffs directory a
// test makes, so that NothingLeft can look for leftovers.
const Prefix = "egret-test-"

const childEnv = "EGRET_BPFTEST_CHILD"

// RandName returns Prefix plus a random suffix.
func RandName() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return Prefix + hex.EncodeToString(b[:])
}

// Cgroups is a test's cgroup subtree; Cleanup removes it.
type Cgroups struct {
	Top string
}

// NewCgroups makes /sys/fs/cgroup/unified/egret-test-XXXX and removes it
// (with everything below) in t.Cleanup.
func NewCgroups(t testing.TB) *Cgroups {
	t.Helper()
	top := filepath.Join(cgroup2.Root(), RandName())
	if err := os.Mkdir(top, 0o755); err != nil {
		t.Fatalf("cgroup: %v", err)
	}
	c := &Cgroups{Top: top}
	t.Cleanup(func() {
		if err := RemoveCgroupTree(top); err != nil {
			t.Errorf("cgroup cleanup: %v", err)
		}
	})
	return c
}

// Sub makes a child cgroup and returns its path.
func (c *Cgroups) Sub(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(c.Top, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatalf("cgroup: %v", err)
	}
	return p
}

// RemoveCgroupTree removes a cgroup and its descendants (deepest first),
// killing what still runs in each (cgroup.kill, Linux 5.14; in a cgroup
// v1 hierarchy, which has none, each process cgroup.procs lists) and
// waiting while exiting processes still hold them (cgroup.events in v2;
// in v1, which has none, the rmdir is retried).
func RemoveCgroupTree(top string) error {
	var dirs []string
	err := filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.WriteFile(filepath.Join(dirs[i], "cgroup.kill"), []byte("1"), 0); errors.Is(err, os.ErrNotExist) {
			procs, _ := os.ReadFile(filepath.Join(dirs[i], "cgroup.procs"))
			for _, p := range strings.Fields(string(procs)) {
				if pid, err := strconv.Atoi(p); err == nil {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		if _, err := os.Stat(filepath.Join(dirs[i], "cgroup.events")); errors.Is(err, os.ErrNotExist) {
			if err := removeV1(dirs[i], 2*time.Second); err != nil {
				return err
			}
			continue
		}
		// The kills are asynchronous: the removal waits for the last
		// exit (cgroup.events), then removes the directory.
		if err := cgroup2.Remove(dirs[i], 2*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// removeV1 removes a cgroup v1 directory (or one already gone). A v1
// cgroup has no cgroup.events to wait on (cgroup2.Remove takes its
// absence for the directory's), and rmdir fails with EBUSY while a killed
// process is still exiting: polls the rmdir, for at most timeout.
func removeV1(dir string, timeout time.Duration) error {
	var err error
	testenv.Poll(timeout, func() bool {
		err = unix.Rmdir(dir)
		return err == nil || errors.Is(err, unix.ENOENT)
	})
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}

// NewNetns makes a network namespace with lo up, plus the given extra
// addresses on lo (e.g. "10.77.0.1/32"). It lives as long as the returned
// handle is open (no bind mount); t.Cleanup closes it.
func NewNetns(t testing.TB, loAddrs ...string) netns.NsHandle {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		ns.Close()
		t.Fatalf("netns restore: %v", err)
	}
	t.Cleanup(func() { ns.Close() })

	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink: %v", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatalf("netlink lo: %v", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatalf("netlink lo up: %v", err)
	}
	for _, a := range loAddrs {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			t.Fatalf("addr %s: %v", a, err)
		}
		if err := h.AddrAdd(lo, addr); err != nil {
			t.Fatalf("addr add %s: %v", a, err)
		}
	}
	return ns
}

// Op is what the child does.
type Op struct {
	// Kind: "listen", "dial" (TCP), "udp" (connect a UDP socket), or
	// "connectloop" (Count TCP connects to Addr, each closed at once,
	// timed; no socket comes back), or "refuseloop" (Count TCP connects
	// to Addr's address and Count consecutive ports from Addr's, each of
	// which must be refused; no socket comes back).
	Kind    string
	Family  int    // unix.AF_INET or unix.AF_INET6
	Addr    string // address to listen on or dial, "ip:port"
	Local   string // optional local address to bind before dialing
	Mark    uint32 // optional SO_MARK
	Timeout time.Duration
	Count   int
	// SynCnt, if not 0, sets TCP_SYNCNT on the socket before connecting:
	// how many SYN retransmissions before connect fails with ETIMEDOUT
	// (1: about 3 s), without touching the host's tcp_syn_retries.
	SynCnt int
}

// Result is what the child reports with the socket.
type Result struct {
	Err   string // errno text of a failed connect/listen, "" on success
	Local string // getsockname after the operation
	Peer  string // getpeername after connect
	Nanos int64  // connectloop: total time of the connects
}

// Socket runs op in a child placed in cgroup and network namespace ns and
// returns the socket it made. A failed connect is not an error of Socket:
// it comes back in Result.Err with a nil file.
func Socket(t testing.TB, cgroup string, ns netns.NsHandle, op Op) (*os.File, Result) {
	t.Helper()
	f, res, err := socket(cgroup, ns, op)
	if err != nil {
		t.Fatalf("bpftest child %+v: %v", op, err)
	}
	if f != nil {
		t.Cleanup(func() { f.Close() })
	}
	return f, res
}

// Loop runs a "connectloop" (or "refuseloop") op as Socket does, without
// a testing.TB: for a goroutine beside the test's, which must not call
// t.Fatal.
func Loop(cgroup string, ns netns.NsHandle, op Op) (Result, error) {
	f, res, err := socket(cgroup, ns, op)
	if f != nil {
		f.Close()
	}
	return res, err
}

func socket(cgroup string, ns netns.NsHandle, op Op) (*os.File, Result, error) {
	var res Result
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, res, err
	}
	parent := os.NewFile(uintptr(pair[0]), "bpftest-parent")
	child := os.NewFile(uintptr(pair[1]), "bpftest-child")
	defer parent.Close()

	cg, err := os.Open(cgroup)
	if err != nil {
		child.Close()
		return nil, res, err
	}
	defer cg.Close()
	// A duplicate, so that closing (or finalizing) the *os.File never
	// closes the caller's handle.
	nsfd, err := unix.FcntlInt(uintptr(ns), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		child.Close()
		return nil, res, err
	}
	nsf := os.NewFile(uintptr(nsfd), "netns")
	defer nsf.Close()

	spec, _ := json.Marshal(op)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	cmd.ExtraFiles = []*os.File{child, nsf} // fd 3, fd 4
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	err = cmd.Start()
	child.Close()
	if err != nil {
		return nil, res, fmt.Errorf("start child: %w", err)
	}
	defer cmd.Wait()

	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(pair[0], buf, oob, 0)
	if err != nil {
		return nil, res, fmt.Errorf("recvmsg: %w", err)
	}
	if n == 0 {
		return nil, res, errors.New("child exited without an answer")
	}
	if err := json.Unmarshal(buf[:n], &res); err != nil {
		return nil, res, err
	}
	if oobn == 0 {
		return nil, res, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, res, fmt.Errorf("control message: %v", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, res, fmt.Errorf("unix rights: %v", err)
	}
	return os.NewFile(uintptr(fds[0]), "bpftest-"+op.Kind), res, nil
}

// RunChildIfRequested turns the process into a socket-making child when it
// was started by Socket; otherwise it returns. Call it first in TestMain.
func RunChildIfRequested() {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return
	}
	runtime.LockOSThread()
	var op Op
	res, fd := Result{}, -1
	if err := json.Unmarshal([]byte(spec), &op); err != nil {
		res.Err = err.Error()
	} else if err := unix.Setns(4, unix.CLONE_NEWNET); err != nil {
		res.Err = "setns: " + err.Error()
	} else {
		fd, res = childOp(op)
	}
	b, _ := json.Marshal(res)
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if err := unix.Sendmsg(3, b, oob, nil, 0); err != nil {
		fmt.Fprintln(os.Stderr, "bpftest child sendmsg:", err)
		os.Exit(2)
	}
	os.Exit(0)
}

func childOp(op Op) (int, Result) {
	var res Result
	if op.Kind == "connectloop" {
		return -1, connectLoop(op)
	}
	if op.Kind == "refuseloop" {
		return -1, refuseLoop(op)
	}
	typ := unix.SOCK_STREAM
	if op.Kind == "udp" {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(op.Family, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		res.Err = "socket: " + err.Error()
		return -1, res
	}
	fail := func(what string, err error) (int, Result) {
		unix.Close(fd)
		res.Err = what + ": " + err.Error()
		return -1, res
	}
	if op.Mark != 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(op.Mark)); err != nil {
			return fail("SO_MARK", err)
		}
	}
	if op.SynCnt != 0 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_SYNCNT, op.SynCnt); err != nil {
			return fail("TCP_SYNCNT", err)
		}
	}
	if op.Timeout == 0 {
		op.Timeout = 3 * time.Second
	}
	tv := unix.NsecToTimeval(op.Timeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	addr, err := sockaddr(op.Family, op.Addr)
	if err != nil {
		return fail("addr", err)
	}
	switch op.Kind {
	case "listen":
		if err := unix.Bind(fd, addr); err != nil {
			return fail("bind", err)
		}
		if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
			return fail("listen", err)
		}
	case "dial", "udp":
		if op.Local != "" {
			la, err := sockaddr(op.Family, op.Local)
			if err != nil {
				return fail("local addr", err)
			}
			if err := unix.Bind(fd, la); err != nil {
				return fail("bind", err)
			}
		}
		if err := unix.Connect(fd, addr); err != nil {
			return fail("connect", err)
		}
		if sa, err := unix.Getpeername(fd); err == nil {
			res.Peer = sockaddrString(sa)
		}
	default:
		return fail("op", fmt.Errorf("unknown kind %q", op.Kind))
	}
	if sa, err := unix.Getsockname(fd); err == nil {
		res.Local = sockaddrString(sa)
	}
	return fd, res
}

func sockaddr(family int, s string) (unix.Sockaddr, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, err
	}
	if family == unix.AF_INET {
		if !ap.Addr().Is4() {
			return nil, fmt.Errorf("%s is not IPv4", s)
		}
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}, nil
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}, nil
}

func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	}
	return fmt.Sprint(sa)
}

// Listener turns a listening socket file from Socket into a
// *net.TCPListener; f is closed (the listener holds its own descriptor), so
// closing the listener closes the socket.
func Listener(t testing.TB, f *os.File) *net.TCPListener {
	t.Helper()
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.(*net.TCPListener)
}

// Conn turns a connected socket file from Socket into a net.Conn; f is
// closed as for Listener.
func Conn(t testing.TB, f *os.File) net.Conn {
	t.Helper()
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// NothingLeft reports what of a test run is still around: bpffs entries
// under pinDir, the given cgroup directories (which should be gone),
// programs attached to the cgroups in attachedTo (which still exist), and
// programs whose
// ids are in progIDs (polled for a while: the kernel frees them
// asynchronously once the last link and descriptor go).
func NothingLeft(pinDir string, cgroups, attachedTo []string, progIDs []uint32) error {
	var left []string
	if _, err := os.Stat(pinDir); err == nil {
		left = append(left, "pin directory "+pinDir)
	}
	for _, c := range cgroups {
		if _, err := os.Stat(c); err == nil {
			left = append(left, "cgroup "+c)
		}
	}
	for _, c := range attachedTo {
		ids, err := AttachedPrograms(c)
		if err != nil {
			left = append(left, fmt.Sprintf("cgroup %s: %v", c, err))
		}
		for _, id := range ids {
			left = append(left, fmt.Sprintf("program %d attached to %s", id, c))
		}
	}
	// Programs are freed after an RCU grace period, announced to no one:
	// polls, for at most 5 s in all.
	deadline := time.Now().Add(5 * time.Second)
	for _, id := range progIDs {
		if !testenv.Poll(time.Until(deadline), func() bool { return !ProgExists(id) }) {
			left = append(left, fmt.Sprintf("bpf program id %d", id))
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("left behind: %s", strings.Join(left, ", "))
	}
	return nil
}

func connectLoop(op Op) Result {
	var res Result
	addr, err := sockaddr(op.Family, op.Addr)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	start := time.Now()
	for i := 0; i < op.Count; i++ {
		fd, err := unix.Socket(op.Family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			res.Err = "socket: " + err.Error()
			return res
		}
		// RST on close: no TIME_WAIT pile-up across iterations.
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1})
		err = unix.Connect(fd, addr)
		unix.Close(fd)
		if err != nil {
			res.Err = "connect: " + err.Error()
			return res
		}
	}
	res.Nanos = time.Since(start).Nanoseconds()
	return res
}

func refuseLoop(op Op) Result {
	var res Result
	ap, err := netip.ParseAddrPort(op.Addr)
	if err != nil || int(ap.Port())+op.Count > 65536 {
		res.Err = fmt.Sprintf("refuseloop %s x %d: %v", op.Addr, op.Count, err)
		return res
	}
	for i := 0; i < op.Count; i++ {
		addr, err := sockaddr(op.Family, netip.AddrPortFrom(ap.Addr(), ap.Port()+uint16(i)).String())
		if err != nil {
			res.Err = err.Error()
			return res
		}
		fd, err := unix.Socket(op.Family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			res.Err = "socket: " + err.Error()
			return res
		}
		err = unix.Connect(fd, addr)
		unix.Close(fd)
		if err != unix.ECONNREFUSED {
			res.Err = fmt.Sprintf("connect %d: %v, want ECONNREFUSED", i, err)
			return res
		}
	}
	return res
}
