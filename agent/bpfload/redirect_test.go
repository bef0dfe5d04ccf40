package bpfload_test

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
	"github.com/egret-proxy/egret/witness"
)

var (
	listen4 = netip.MustParseAddrPort("127.0.0.1:15001")
	listen6 = netip.MustParseAddrPort("[::1]:15001")
)

func TestRedirectIPv4RecoversOriginal(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4})
	egret := listen(t, e.self, p.ns, listen4.String())

	client, res := dial(t, p.cg, p.ns, bpftest.Op{Addr: "192.0.2.10:8080"})
	if res.Peer != listen4.String() {
		t.Errorf("client peer = %s, want the listener %s", res.Peer, listen4)
	}
	srv := expectAt(t, egret)
	if got := origDst(t, srv); got != netip.MustParseAddrPort("192.0.2.10:8080") {
		t.Fatalf("original destination = %s", got)
	}
	roundTrip(t, client, srv)

	// Other options on sockets in egret's cgroup pass through getsockopt.
	ti, err := (witness.TCPInfo{}).Snapshot(rawConn(t, srv))
	if err != nil || ti.State != 1 {
		t.Fatalf("TCP_INFO on the accepted socket: %+v, %v", ti, err)
	}
}

func TestTwoPodsIdenticalTuples(t *testing.T) {
	e := setup(t)
	a := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4})
	b := e.pod(t, "pod-b", bpfload.PodConfig{Listen4: listen4})
	la := listen(t, e.self, a.ns, listen4.String())
	lb := listen(t, e.self, b.ns, listen4.String())

	// Same client address and port, same listener: the 4-tuples are equal
	// in both namespaces; only the original destinations differ.
	ca, ra := dial(t, a.cg, a.ns, bpftest.Op{Addr: "198.51.100.1:80", Local: "127.0.0.1:40000"})
	cb, rb := dial(t, b.cg, b.ns, bpftest.Op{Addr: "198.51.100.2:81", Local: "127.0.0.1:40000"})
	if ra.Local != rb.Local || ra.Peer != rb.Peer {
		t.Fatalf("tuples differ: %+v %+v", ra, rb)
	}
	sa := expectAt(t, la)
	sb := expectAt(t, lb)
	if got := origDst(t, sa); got != netip.MustParseAddrPort("198.51.100.1:80") {
		t.Errorf("pod a original = %s", got)
	}
	if got := origDst(t, sb); got != netip.MustParseAddrPort("198.51.100.2:81") {
		t.Errorf("pod b original = %s", got)
	}
	roundTrip(t, ca, sa)
	roundTrip(t, cb, sb)
}

func TestRedirectIPv6(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4, Listen6: listen6})
	l6 := listen(t, e.self, p.ns, listen6.String())
	l4 := listen(t, e.self, p.ns, listen4.String())

	c, res := dial(t, p.cg, p.ns, bpftest.Op{Addr: "[2001:db8::10]:8443"})
	if res.Peer != listen6.String() {
		t.Errorf("client peer = %s", res.Peer)
	}
	s := expectAt(t, l6, l4)
	if got := origDst(t, s); got != netip.MustParseAddrPort("[2001:db8::10]:8443") {
		t.Fatalf("original = %s", got)
	}
	roundTrip(t, c, s)

	// A dual-stack IPv6 socket dialing an IPv4 address goes to the IPv4
	// listener and the original comes back as IPv4.
	c, _ = dial(t, p.cg, p.ns, bpftest.Op{Family: unix.AF_INET6, Addr: "[::ffff:192.0.2.7]:80"})
	s = expectAt(t, l4, l6)
	if got := origDst(t, s); got != netip.MustParseAddrPort("192.0.2.7:80") {
		t.Fatalf("original = %s", got)
	}
	roundTrip(t, c, s)
}

func TestWhatGoesDirect(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{
		Listen4:         listen4,
		ExcludePorts:    []uint16{8081},
		ExcludePrefixes: []netip.Prefix{netip.MustParsePrefix("10.77.1.0/24")},
	}, "10.77.0.1/32", "10.77.1.1/32")
	egret := listen(t, e.self, p.ns, listen4.String())

	cases := []struct {
		name string
		addr string
		mark uint32
	}{
		{"loopback", "127.0.0.1:9000", 0},
		{"default excluded port (MySQL)", "10.77.0.1:3306", 0},
		{"excluded port", "10.77.0.1:8081", 0},
		{"excluded CIDR", "10.77.1.1:8080", 0},
		{"egret's own marked socket", "10.77.0.1:8080", e.l.Mark()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			direct := listen(t, e.self, p.ns, tc.addr)
			c, res := dial(t, p.cg, p.ns, bpftest.Op{Addr: tc.addr, Mark: tc.mark})
			if res.Peer != tc.addr {
				t.Errorf("client peer = %s, want %s", res.Peer, tc.addr)
			}
			s := expectAt(t, direct, egret)
			if _, err := bpfload.OriginalDst(rawConn(t, s)); !errors.Is(err, bpfload.ErrNoOriginalDst) {
				t.Errorf("OriginalDst on a direct connection: %v", err)
			}
			roundTrip(t, c, s)
		})
	}

	// Not excluded: the same address on port 8080 is redirected.
	direct := listen(t, e.self, p.ns, "10.77.0.1:8080")
	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	s := expectAt(t, egret, direct)
	if got := origDst(t, s); got.String() != "10.77.0.1:8080" {
		t.Fatalf("original = %s", got)
	}

	// UDP is untouched.
	f, res := bpftest.Socket(t, p.cg, p.ns, bpftest.Op{Kind: "udp", Family: unix.AF_INET, Addr: "10.77.0.1:53"})
	if res.Err != "" || f == nil {
		t.Fatalf("udp: %s", res.Err)
	}
	if res.Peer != "10.77.0.1:53" {
		t.Fatalf("udp peer = %s", res.Peer)
	}
}

func TestFailOpenWithoutListener(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4}, "10.77.0.1/32")
	direct := listen(t, e.self, p.ns, "10.77.0.1:8080")

	// No egret listener in the pod: connects go direct instead of failing.
	_, res := dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	if res.Peer != "10.77.0.1:8080" {
		t.Fatalf("peer = %s", res.Peer)
	}
	expectAt(t, direct)

	// With the listener back, redirection resumes.
	egret := listen(t, e.self, p.ns, listen4.String())
	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	expectAt(t, egret, direct)

	// And after it closes, direct again.
	egret.Close()
	_, res = dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	if res.Peer != "10.77.0.1:8080" {
		t.Fatalf("peer after listener closed = %s", res.Peer)
	}
	expectAt(t, direct)
}

func TestDetachPod(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4}, "10.77.0.1/32")
	egret := listen(t, e.self, p.ns, listen4.String())
	direct := listen(t, e.self, p.ns, "10.77.0.1:8080")

	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	expectAt(t, egret, direct)

	if err := e.l.DetachPod(p.cg); err != nil {
		t.Fatal(err)
	}
	if ids, _ := e.l.Pods(); len(ids) != 0 {
		t.Fatalf("pods after detach: %v", ids)
	}
	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	expectAt(t, direct, egret)
}

func TestRestartAdoptsPinnedState(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4}, "10.77.0.1/32")
	egret := listen(t, e.self, p.ns, listen4.String())
	direct := listen(t, e.self, p.ns, "10.77.0.1:8080")

	// The agent goes away without cleaning up. Its listener lives on (as
	// when egret keeper holds it), yet new connects go direct: the
	// liveness socket went with the Loader.
	if err := e.l.Close(); err != nil {
		t.Fatal(err)
	}
	if alive, err := e.l.Alive(); err == nil && alive {
		t.Fatal("egret_alive still holds a socket after Close")
	}
	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	expectAt(t, direct, egret)

	// A new agent adopts the pinned maps and links; connects are
	// redirected again once it says it serves.
	l2, err := bpfload.Load(bpfload.Options{PinDir: e.pin})
	if err != nil {
		t.Fatal(err)
	}
	e.l = l2 // setup's cleanup removes through the new loader
	if alive, err := l2.Alive(); err != nil || alive {
		t.Fatalf("Alive after Load = %v, %v; want false until SetAlive", alive, err)
	}
	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	expectAt(t, direct, egret)
	if err := l2.SetAlive(); err != nil {
		t.Fatal(err)
	}
	if alive, err := l2.Alive(); err != nil || !alive {
		t.Fatalf("Alive after SetAlive = %v, %v; want true", alive, err)
	}
	ids, err := l2.Pods()
	if err != nil || len(ids) != 1 || ids[0] != p.id {
		t.Fatalf("adopted pods = %v, %v; want [%d]", ids, err, p.id)
	}
	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8081"})
	if s := expectAt(t, egret, direct); origDst(t, s).String() != "10.77.0.1:8081" {
		t.Fatal("original wrong after adoption")
	}
	if _, err := os.Stat(e.pin); err != nil {
		t.Fatal(err)
	}
}

// A listener made outside egret's cgroup (an earlier agent's, adopted from
// egret keeper after that agent's container cgroup went) gets no
// SO_ORIGINAL_DST answer: OriginalDstOf finds the destination in the
// tuple map instead, for IPv4 and IPv6.
func TestOriginalDstOfAdoptedListener(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4, Listen6: listen6})
	old := e.cg.Sub(t, "old-agent")
	l4 := listen(t, old, p.ns, listen4.String())
	l6 := listen(t, old, p.ns, listen6.String())

	for _, tc := range []struct {
		dst string
		l   *net.TCPListener
	}{{"192.0.2.44:8080", l4}, {"[2001:db8::44]:8443", l6}} {
		c, _ := dial(t, p.cg, p.ns, bpftest.Op{Addr: tc.dst})
		s := expectAt(t, tc.l)
		if _, err := bpfload.OriginalDst(rawConn(t, s)); !errors.Is(err, bpfload.ErrNoOriginalDst) {
			t.Fatalf("%s: OriginalDst on a socket outside egret's cgroup = %v, want ErrNoOriginalDst", tc.dst, err)
		}
		got, err := e.l.OriginalDstOf(rawConn(t, s))
		if err != nil || got.String() != tc.dst {
			t.Fatalf("OriginalDstOf = %v, %v; want %s", got, err, tc.dst)
		}
		roundTrip(t, c, s)
	}
	// A connection egret did not redirect is not in the map.
	c, _ := dial(t, p.cg, p.ns, bpftest.Op{Addr: listen4.String()})
	s := expectAt(t, l4)
	if _, err := e.l.OriginalDstOf(rawConn(t, s)); !errors.Is(err, bpfload.ErrNoOriginalDst) {
		t.Fatalf("OriginalDstOf of a connection to the listener itself = %v, want ErrNoOriginalDst", err)
	}
	c.Close()
}

// With RedirectLoopback a pod's connects to its own 127.0.0.1 are
// redirected too (the listener itself excepted).
func TestRedirectLoopbackOptIn(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4, Listen6: listen6, RedirectLoopback: true})
	egret := listen(t, e.self, p.ns, listen4.String())
	egret6 := listen(t, e.self, p.ns, listen6.String())
	direct := listen(t, e.self, p.ns, "127.0.0.1:9000")

	c, _ := dial(t, p.cg, p.ns, bpftest.Op{Addr: "127.0.0.1:9000"})
	s := expectAt(t, egret, direct)
	if got := origDst(t, s).String(); got != "127.0.0.1:9000" {
		t.Fatalf("original = %s", got)
	}
	roundTrip(t, c, s)

	dial(t, p.cg, p.ns, bpftest.Op{Addr: "[::1]:9000"})
	if got := origDst(t, expectAt(t, egret6)).String(); got != "[::1]:9000" {
		t.Fatalf("original = %s", got)
	}

	// Dialing the listener itself is never rewritten.
	_, res := dial(t, p.cg, p.ns, bpftest.Op{Addr: listen4.String()})
	s = expectAt(t, egret)
	if _, err := bpfload.OriginalDst(rawConn(t, s)); !errors.Is(err, bpfload.ErrNoOriginalDst) || res.Peer != listen4.String() {
		t.Fatalf("dial to the listener: peer %s, OriginalDst err %v", res.Peer, err)
	}
}

// A connection redirected before its pod's detach and accepted after it
// still finds its original destination until forget; DetachPodID (the
// immediate kind) takes it away at once.
func TestDetachPodDrainedKeepsDestinations(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4}, "10.77.0.1/32")
	egret := listen(t, e.self, p.ns, listen4.String())
	direct := listen(t, e.self, p.ns, "10.77.0.1:8080")

	// Redirected, waiting in egret's accept queue while the pod goes.
	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	id, err := bpfload.CgroupID(p.cg)
	if err != nil {
		t.Fatal(err)
	}
	forget, err := e.l.DetachPodDrained(id)
	if err != nil {
		t.Fatal(err)
	}
	c := expectAt(t, egret, direct)
	if got := origDst(t, c); got.String() != "10.77.0.1:8080" {
		t.Fatalf("original destination after the detach: %s", got)
	}
	// New connects go direct.
	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	expectAt(t, direct, egret)
	if err := forget(); err != nil {
		t.Fatal(err)
	}
	if _, err := bpfload.OriginalDst(rawConn(t, c)); !errors.Is(err, bpfload.ErrNoOriginalDst) {
		t.Fatalf("after forget: %v", err)
	}

	// The immediate detach: a connection accepted after it is lost.
	e.l.AttachPod(p.cg, bpfload.PodConfig{Listen4: listen4})
	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	if err := e.l.DetachPodID(id); err != nil {
		t.Fatal(err)
	}
	c = expectAt(t, egret, direct)
	if _, err := bpfload.OriginalDst(rawConn(t, c)); !errors.Is(err, bpfload.ErrNoOriginalDst) {
		t.Fatalf("after DetachPodID: %v", err)
	}
}

// forget leaves a tuple a later connection wrote: the pod came back and
// redirects again before the old proxy drained.
func TestDetachPodDrainedForgetSparesNewTuples(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4}, "10.77.0.1/32")
	egret := listen(t, e.self, p.ns, listen4.String())
	id, err := bpfload.CgroupID(p.cg)
	if err != nil {
		t.Fatal(err)
	}
	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8080"})
	old := expectAt(t, egret)
	forget, err := e.l.DetachPodDrained(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.l.AttachPod(p.cg, bpfload.PodConfig{Listen4: listen4}); err != nil {
		t.Fatal(err)
	}
	dial(t, p.cg, p.ns, bpftest.Op{Addr: "10.77.0.1:8081"})
	fresh := expectAt(t, egret)
	if err := forget(); err != nil {
		t.Fatal(err)
	}
	if _, err := bpfload.OriginalDst(rawConn(t, old)); !errors.Is(err, bpfload.ErrNoOriginalDst) {
		t.Fatalf("the old connection's destination after forget: %v", err)
	}
	if got := origDst(t, fresh); got.String() != "10.77.0.1:8081" {
		t.Fatalf("the new connection's destination after the old forget: %s", got)
	}
}
