package e2e

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
	"github.com/egret-proxy/egret/agent/netns"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/retry"
)

// Prefix starts the name of every cgroup, bpffs directory, namespace and
// interface-name family the tests make, so leftovers can be found.
const Prefix = "egret-t-"

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// node is an egret agent run in this test process, with its own pin
// directory and cgroup subtree. The test process moves into the agent's
// cgroup (sockets belong to the cgroup of the process that creates them)
// and back at the end, so tests using node must not run in parallel.
type node struct {
	t      testing.TB
	name   string
	top    string // cgroup subtree of the test
	self   string // the agent's cgroup (this process)
	pin    string
	loader *bpfload.Loader
	src    *pods.Memory
	agent  *agent.Agent
	stop   func()
	progs  []uint32
}

type nodeOpts struct {
	wrapDial func(pod string, d proxy.DialFunc) proxy.DialFunc
	proxy    proxy.Config
	// learnedMax sizes the kernel's learned-direct map (0: the default).
	learnedMax uint32
	// logger is the agent's (nil: testLogger).
	logger *slog.Logger
}

func newNode(t testing.TB, o nodeOpts) *node {
	t.Helper()
	testenv.RequireRoot(t)
	n := &node{t: t, name: Prefix + randHex(4)}
	n.top = filepath.Join(cgroup2.Root(), n.name)
	n.self = filepath.Join(n.top, "egret")
	n.pin = filepath.Join(bpfload.BPFFSRoot, n.name)
	orig, err := agent.CurrentCgroup()
	if err != nil {
		t.Fatal(err)
	}
	// Registered first: runs last, after every pod and the agent are gone.
	t.Cleanup(func() {
		if err := agent.EnterCgroup(orig); err != nil {
			t.Errorf("back to %s: %v", orig, err)
		}
		removeCgroupTree(t, n.top)
		assertNothingLeft(t, n.name, n.progs)
	})
	if err := agent.EnterCgroup(n.self); err != nil {
		t.Fatal(err)
	}
	n.loader, err = bpfload.Load(bpfload.Options{PinDir: n.pin, LearnedMax: o.learnedMax})
	if err != nil {
		testenv.Require(t, false, "egret's eBPF programs load: "+err.Error())
	}
	for _, id := range n.loader.ProgramIDs() {
		n.progs = append(n.progs, uint32(id))
	}
	t.Cleanup(func() {
		if err := n.loader.Remove(); err != nil {
			t.Errorf("loader Remove: %v", err)
		}
		n.loader.Close()
	})
	n.src, _ = pods.NewMemory()
	n.agent, err = agent.New(agent.Config{
		Attacher:      n.loader,
		Source:        n.src,
		SelfCgroup:    n.self,
		Mark:          n.loader.Mark(),
		Witness:       n.loader.Witness(),
		Proxy:         o.proxy,
		ShutdownGrace: time.Second,
		CleanupOnExit: true,
		WrapDial:      o.wrapDial,
		Logger:        cmp.Or(o.logger, testLogger(t)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.agent.Run(ctx) }()
	var stopped bool
	n.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent Run: %v", err)
		}
	}
	t.Cleanup(n.stop)
	return n
}

// made records the namespaces and interfaces each test created, so the
// nothing-left check looks only at its own (other tests on the machine may
// use the same prefixes at the same time).
var made sync.Map // testing.TB -> *madeBy

type madeBy struct {
	mu     sync.Mutex
	netns  []string
	ifaces []string
}

func track(t testing.TB) *madeBy {
	m, _ := made.LoadOrStore(t, &madeBy{})
	return m.(*madeBy)
}

func (m *madeBy) add(ns, iface string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ns != "" {
		m.netns = append(m.netns, ns)
	}
	if iface != "" {
		m.ifaces = append(m.ifaces, iface)
	}
}

// pod is a test pod: a cgroup under the test's subtree and a network
// namespace joined to the host by a veth pair.
type pod struct {
	name    string
	cgroup  string
	ns      *netns.NS
	nsName  string
	host4   netip.Addr // host end of the veth
	pod4    netip.Addr
	host6   netip.Addr
	pod6    netip.Addr
	hostIf  string
	cgroupF *os.File
}

type podOpts struct {
	spec    pods.Pod // Name, Cgroup and Netns are filled in
	noVeth  bool
	noStart bool // make the pod but do not give it to the agent
}

// makePod creates a cgroup and a namespace (with a veth to the host) under
// the test's names, removed in t.Cleanup.
func makePod(t testing.TB, top, name string, o podOpts) *pod {
	t.Helper()
	p := &pod{name: name, cgroup: filepath.Join(top, name), nsName: Prefix + randHex(4)}
	if err := os.MkdirAll(p.cgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	p.ns, err = netns.NewNamed(p.nsName)
	if err != nil {
		t.Fatal(err)
	}
	track(t).add(p.nsName, "")
	t.Cleanup(func() {
		p.ns.Close()
		if err := netns.DeleteNamed(p.nsName); err != nil {
			t.Error(err)
		}
	})
	p.cgroupF, err = os.Open(p.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cgroupF.Close() })
	if !o.noVeth {
		p.veth(t)
	}
	return p
}

// veth joins the pod to the host: 10.a.b.1/24 and fd00:a:b::1/64 on the
// host end, .2 and ::2 in the pod with default routes through the host.
func (p *pod) veth(t testing.TB) {
	t.Helper()
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	b[0] = 64 + b[0]%128
	p.host4 = netip.AddrFrom4([4]byte{10, b[0], b[1], 1})
	p.pod4 = netip.AddrFrom4([4]byte{10, b[0], b[1], 2})
	p.host6 = netip.MustParseAddr(fmt.Sprintf("fd00:%x:%x::1", b[0], b[1]))
	p.pod6 = netip.MustParseAddr(fmt.Sprintf("fd00:%x:%x::2", b[0], b[1]))
	p.hostIf = "egt" + randHex(4)
	peer := "egp" + randHex(4)
	track(t).add("", p.hostIf)
	la := netlink.NewLinkAttrs()
	la.Name = p.hostIf
	veth := &netlink.Veth{LinkAttrs: la, PeerName: peer}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("veth: %v", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(p.hostIf); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	host, err := netlink.LinkByName(p.hostIf)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := netlink.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(p.ns.Path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := netlink.LinkSetNsFd(pl, fd); err != nil {
		t.Fatal(err)
	}
	addr := func(a netip.Addr, bits int) *netlink.Addr {
		return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}, Flags: unix.IFA_F_NODAD}
	}
	for _, a := range []*netlink.Addr{addr(p.host4, 24), addr(p.host6, 64)} {
		if err := netlink.AddrAdd(host, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := netlink.LinkSetUp(host); err != nil {
		t.Fatal(err)
	}
	err = p.ns.Do(func() error {
		l, err := netlink.LinkByName(peer)
		if err != nil {
			return err
		}
		for _, a := range []*netlink.Addr{addr(p.pod4, 24), addr(p.pod6, 64)} {
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		for _, gw := range []netip.Addr{p.host4, p.host6} {
			r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}
			if err := netlink.RouteAdd(r); err != nil {
				return fmt.Errorf("route via %s: %w", gw, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// addPod makes a pod and puts it behind the node's agent, waiting until
// it runs.
func (n *node) addPod(t testing.TB, name string, o podOpts) *pod {
	t.Helper()
	p := makePod(t, n.top, name, o)
	spec := o.spec
	spec.Name, spec.Cgroup, spec.Netns = name, p.cgroup, p.ns.Path()
	if err := n.src.Put(spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.src.Remove(name) })
	n.waitPod(t, name, agent.StateRunning)
	return p
}

func (n *node) waitPod(t testing.TB, name, state string) agent.PodStatus {
	t.Helper()
	var st agent.PodStatus
	var err error
	if !n.awaitPods(10*time.Second, func() bool { st, err = n.agent.Pod(name); return err == nil && st.State == state }) {
		t.Fatalf("pod %s not %s: %+v %v", name, state, st, err)
	}
	return st
}

// awaitPods waits until cond (a look at the agent's pods) holds, asking
// it again at each change the agent announces (PodsChanged: a pod
// started, failed or went), for at most timeout; it says whether cond
// held.
func (n *node) awaitPods(timeout time.Duration, cond func() bool) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		changed := n.agent.PodsChanged() // before cond looks: no change is missed
		if cond() {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return cond()
		}
	}
}

// command returns cmd set to start inside the pod's cgroup; start it with
// p.start so that it is also inside the pod's namespace.
func (p *pod) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(p.cgroupF.Fd())}
	return cmd
}

// start forks cmd on a thread inside the pod's namespace: the child is
// born in the pod's cgroup and namespace, like a process of the pod.
func (p *pod) start(cmd *exec.Cmd) error { return p.ns.Do(cmd.Start) }

// run runs cmd in the pod and returns its standard output.
func (p *pod) run(t testing.TB, cmd *exec.Cmd) (string, error) {
	t.Helper()
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := p.start(cmd); err != nil {
		return "", err
	}
	err := cmd.Wait()
	if err != nil {
		err = fmt.Errorf("%s: %w: %s", cmd.Args[0], err, errb.String())
	}
	return out.String(), err
}

func removeCgroupTree(t testing.TB, dir string) {
	t.Helper()
	if err := bpftest.RemoveCgroupTree(dir); err != nil {
		t.Errorf("remove cgroup tree %s: %v", dir, err)
	}
}

// assertNothingLeft checks that no cgroup, pin, namespace, interface or
// program of the test named name remains.
func assertNothingLeft(t testing.TB, name string, progs []uint32) {
	t.Helper()
	for _, p := range []string{
		filepath.Join(cgroup2.Root(), name),
		filepath.Join(bpfload.BPFFSRoot, name),
	} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("left behind: %s (%v)", p, err)
			// Reported; now removed, so that what a failed test left
			// (pinned tracepoint links run on every send of the
			// machine) does not weigh on the tests and benchmarks
			// after it. Unpinning a dead agent's link detaches it.
			if strings.HasPrefix(p, bpfload.BPFFSRoot) {
				if err := os.RemoveAll(p); err != nil {
					t.Errorf("removing %s: %v", p, err)
				}
			}
		}
	}
	m := track(t)
	m.mu.Lock()
	nss, ifs := append([]string(nil), m.netns...), append([]string(nil), m.ifaces...)
	m.mu.Unlock()
	for _, ns := range nss {
		if _, err := os.Stat(filepath.Join(netns.Dir, ns)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("left behind: namespace %s/%s", netns.Dir, ns)
		}
	}
	for _, name := range ifs {
		if _, err := netlink.LinkByName(name); err == nil {
			t.Errorf("left behind: interface %s", name)
		}
	}
	// Rules the tests add carry a comment with Prefix; they live in the
	// pods' namespaces and must not be in the host's.
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		if out, err := exec.Command(save).Output(); err == nil && strings.Contains(string(out), Prefix) {
			t.Errorf("left behind: %s rules with %q", save, Prefix)
		}
	}
	// Programs are freed after an RCU grace period, announced to no one:
	// polls, for at most 5 s in all.
	deadline := time.Now().Add(5 * time.Second)
	for _, id := range progs {
		if !testenv.Poll(time.Until(deadline), func() bool { return !bpftest.ProgExists(id) }) {
			t.Errorf("left behind: eBPF program %d", id)
		}
	}
}

// trace returns the trace of a request id. The proxy stores a trace when
// the exchange ends, which may be just after the client has its answer.
func (n *node) trace(id string) (retry.Trace, bool) {
	var tr retry.Trace
	var ok bool
	// Polls: the agent announces no trace (a pod's Traces.Watch is
	// inside the agent, for one outcome).
	testenv.Poll(5*time.Second, func() bool { tr, _, ok = n.agent.Trace(id); return ok })
	return tr, ok
}
