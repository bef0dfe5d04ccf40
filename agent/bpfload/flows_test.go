package bpfload_test

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
)

// blackhole routes prefix through lo in the namespace of p. Nothing there
// owns those addresses and the namespace does not forward, so a SYN to
// one is dropped without an answer (no ICMP either). The route goes with
// the namespace.
func blackhole(t *testing.T, p pod, prefix string) {
	t.Helper()
	h, err := netlink.NewHandleAt(p.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	dst, err := netlink.ParseIPNet(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: dst}); err != nil {
		t.Fatalf("route %s: %v", prefix, err)
	}
}

// failConnect makes a connect from the pod that must fail with want.
func failConnect(t *testing.T, p pod, op bpftest.Op, want syscall.Errno) {
	t.Helper()
	op.Kind, op.Family = "dial", unix.AF_INET
	_, res := bpftest.Socket(t, p.cg, p.ns, op)
	if !strings.Contains(res.Err, want.Error()) {
		t.Fatalf("connect %s: %q, want %v", op.Addr, res.Err, want)
	}
}

// resetBy makes the server end an accepted connection with an RST
// (SO_LINGER 0) and checks the client sees ECONNRESET: by then the kernel
// has processed the RST on the client's socket.
func resetBy(t *testing.T, server *net.TCPConn, client net.Conn) {
	t.Helper()
	if err := server.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	server.Close()
	_ = client.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err := client.Read(make([]byte, 1))
	if !errors.Is(err, unix.ECONNRESET) {
		t.Fatalf("client read after the reset: %v, want ECONNRESET", err)
	}
}

// Each failure of a connection egret left direct is counted once, in its
// class, for its pod and path: refused, timed out (SYN retries exhausted on
// a blackholed address), reset before any of the pod's bytes was acked and
// after; a learned-direct destination is counted too; a redirected
// connection and another pod are not.
func TestFlowOutcomes(t *testing.T) {
	e := setup(t)
	cfg := bpfload.PodConfig{Listen4: listen4, ExcludePorts: []uint16{7001, 7002, 7003},
		ExcludePrefixes: []netip.Prefix{netip.MustParsePrefix("10.66.0.0/24")}}
	a := e.pod(t, "pod-a", cfg, "10.77.0.1/32")
	b := e.pod(t, "pod-b", cfg, "10.77.0.1/32")
	egretA := listen(t, e.self, a.ns, listen4.String())
	blackhole(t, a, "10.66.0.0/24")

	// Redirected: egret proxies it, the kernel's flow counters do not see it.
	c, res := dial(t, a.cg, a.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	if res.Peer != listen4.String() {
		t.Fatalf("redirected connect: peer %s", res.Peer)
	}
	expectAt(t, egretA)
	c.Close()

	// Refused: an excluded port nobody listens on.
	failConnect(t, a, bpftest.Op{Addr: "10.77.0.1:7001"}, unix.ECONNREFUSED)

	// Timed out: an excluded prefix whose SYNs vanish. One SYN retry on
	// this socket: connect gives up after about 3 s.
	start := time.Now()
	failConnect(t, a, bpftest.Op{Addr: "10.66.0.2:80", SynCnt: 1, Timeout: 20 * time.Second}, unix.ETIMEDOUT)
	t.Logf("timed out after %v", time.Since(start).Round(time.Millisecond))

	// Reset before any byte of the pod's was acked.
	up2 := listen(t, e.self, a.ns, "10.77.0.1:7002")
	c, _ = dial(t, a.cg, a.ns, bpftest.Op{Addr: "10.77.0.1:7002"})
	resetBy(t, expectAt(t, up2), c)
	c.Close()

	// Reset after the pod's bytes were acked (the peer's answer acks them).
	up3 := listen(t, e.self, a.ns, "10.77.0.1:7003")
	c, _ = dial(t, a.cg, a.ns, bpftest.Op{Addr: "10.77.0.1:7003"})
	s := expectAt(t, up3)
	roundTrip(t, c, s)
	if _, err := s.Write([]byte("!")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	resetBy(t, s, c)
	c.Close()

	// Learned direct: one connect established, then one refused.
	dst := netip.MustParseAddrPort("10.77.0.1:9443")
	up4 := listen(t, e.self, a.ns, dst.String())
	if err := e.l.LearnDirect(a.id, dst, bpfload.DirectTLS, time.Hour); err != nil {
		t.Fatal(err)
	}
	c, res = dial(t, a.cg, a.ns, bpftest.Op{Addr: dst.String()})
	if res.Peer != dst.String() {
		t.Fatalf("learned: peer %s, want %s", res.Peer, dst)
	}
	expectAt(t, up4, egretA)
	c.Close()
	up4.Close()
	failConnect(t, a, bpftest.Op{Addr: dst.String()}, unix.ECONNREFUSED)

	got, err := e.l.PodFlows(a.id)
	if err != nil {
		t.Fatal(err)
	}
	port := got[bpfload.PathPolicyPort]
	if port.Connects != 3 || port.Established != 2 || port.Refused != 1 || port.ResetBeforeAck != 1 ||
		port.ResetAfterAck != 1 || port.TimedOut != 0 || port.Unreachable != 0 || port.Abandoned != 0 {
		t.Errorf("direct_port = %+v", port)
	}
	cidr := got[bpfload.PathPolicyCIDR]
	if cidr.Connects != 1 || cidr.TimedOut != 1 || cidr.Established != 0 || cidr.Refused != 0 ||
		cidr.Retransmits < 1 {
		t.Errorf("direct_cidr = %+v", cidr)
	}
	learned := got[bpfload.PathLearned]
	if learned.Connects != 2 || learned.Established != 1 || learned.Refused != 1 ||
		learned.ResetBeforeAck+learned.ResetAfterAck+learned.TimedOut != 0 {
		t.Errorf("learned_direct = %+v", learned)
	}
	if _, ok := got[bpfload.PathFailOpen]; ok || len(got) != 3 {
		t.Errorf("paths = %+v", got)
	}
	if n := port.SafeToRetry() + cidr.SafeToRetry() + learned.SafeToRetry(); n != 3 {
		t.Errorf("safe to retry = %d, want 3 (refused x2, timed out)", n)
	}
	if n := port.Ambiguous() + cidr.Ambiguous() + learned.Ambiguous(); n != 2 {
		t.Errorf("ambiguous = %d, want 2 (reset before ack, reset after ack)", n)
	}
	if other, err := e.l.PodFlows(b.id); err != nil || len(other) != 0 {
		t.Errorf("pod-b flows = %+v, %v", other, err)
	}

	// Detaching removes the pod's entries; the node's sums keep them.
	if err := e.l.DetachPodID(a.id); err != nil {
		t.Fatal(err)
	}
	if n, err := e.l.FlowEntries(); err != nil || n != 0 {
		t.Errorf("flow entries after detach = %d, %v", n, err)
	}
	node, err := e.l.NodeFlows()
	if err != nil {
		t.Fatal(err)
	}
	var sum bpfload.FlowStats
	for _, f := range node {
		if f.PodID != 0 {
			t.Errorf("attached pod in node flows after detach: %+v", f)
		}
		sum.Add(f.Stats)
	}
	if sum.Connects != 6 || sum.Refused != 2 || sum.TimedOut != 1 {
		t.Errorf("node flows after detach = %+v", sum)
	}
}

// A pod whose agent is gone fails open; its direct connects are counted
// under fail_open.
func TestFlowFailOpen(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4}, "10.77.0.1/32")
	// No listener in the pod's namespace: connects go direct.
	up := listen(t, e.self, p.ns, "10.77.0.1:8080")
	c, res := dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	if res.Peer != "10.77.0.1:8080" {
		t.Fatalf("peer %s", res.Peer)
	}
	expectAt(t, up)
	c.Close()
	got, err := e.l.PodFlows(p.id)
	if err != nil {
		t.Fatal(err)
	}
	if f := got[bpfload.PathFailOpen]; f.Connects != 1 || f.Established != 1 || len(got) != 1 {
		t.Errorf("flows = %+v", got)
	}
}

// The counters are keyed by pod and path, never by destination: a pod
// refused by 1,000 destinations has one entry per path it used.
func TestFlowEntriesBoundedByDestinations(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4,
		ExcludePrefixes: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/24")}}, "10.77.0.1/32")
	const n = 1000
	before := e.l.FlowsMemlock()
	_, res := bpftest.Socket(t, p.cg, p.ns, bpftest.Op{Kind: "refuseloop", Family: unix.AF_INET, Addr: "10.77.0.1:20000", Count: n})
	if res.Err != "" {
		t.Fatal(res.Err)
	}
	got, err := e.l.PodFlows(p.id)
	if err != nil {
		t.Fatal(err)
	}
	if f := got[bpfload.PathPolicyCIDR]; f.Connects != n || f.Refused != n || len(got) != 1 {
		t.Errorf("flows = %+v", got)
	}
	if k, err := e.l.FlowEntries(); err != nil || k != 1 {
		t.Errorf("entries = %d, %v; want 1", k, err)
	}
	t.Logf("egret_flows memlock: %d B empty, %d B with one pod's path (%d CPUs possible)",
		before, e.l.FlowsMemlock(), ebpf.MustPossibleCPU())
}

// IPv6 connects left direct are counted as IPv4 ones are.
func TestFlowOutcomesIPv6(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4, Listen6: listen6, ExcludePorts: []uint16{7001}}, "fd00:77::1/128")
	_, res := bpftest.Socket(t, p.cg, p.ns, bpftest.Op{Kind: "dial", Family: unix.AF_INET6, Addr: "[fd00:77::1]:7001"})
	if !strings.Contains(res.Err, unix.ECONNREFUSED.Error()) {
		t.Fatalf("connect: %q, want ECONNREFUSED", res.Err)
	}
	got, err := e.l.PodFlows(p.id)
	if err != nil {
		t.Fatal(err)
	}
	if f := got[bpfload.PathPolicyPort]; f.Connects != 1 || f.Refused != 1 || len(got) != 1 {
		t.Errorf("flows = %+v", got)
	}
}

// A connect whose next hop never answers ARP ends, after the kernel's
// neighbour probes, with EHOSTUNREACH: counted as unreachable.
func TestFlowUnreachable(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4,
		ExcludePrefixes: []netip.Prefix{netip.MustParsePrefix("10.68.0.0/24")}})
	h, err := netlink.NewHandleAt(p.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// A veth pair inside the pod's namespace: the far end is up but owns
	// no address on the prefix, so nobody answers ARP for 10.68.0.2.
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "egret-near"}, PeerName: "egret-far"}
	if err := h.LinkAdd(v); err != nil {
		t.Fatalf("veth: %v", err)
	}
	far, err := h.LinkByName("egret-far")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("10.68.0.1/24")
	if err := h.AddrAdd(v, addr); err != nil {
		t.Fatal(err)
	}
	for _, l := range []netlink.Link{v, far} {
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	failConnect(t, p, bpftest.Op{Addr: "10.68.0.2:80", Timeout: 30 * time.Second}, unix.EHOSTUNREACH)
	t.Logf("unreachable after %v", time.Since(start).Round(time.Millisecond))
	got, err := e.l.PodFlows(p.id)
	if err != nil {
		t.Fatal(err)
	}
	if f := got[bpfload.PathPolicyCIDR]; f.Connects != 1 || f.Unreachable != 1 || f.TimedOut != 0 || len(got) != 1 {
		t.Errorf("flows = %+v", got)
	}
}
