package bpfload_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
)

// A learned destination goes direct: its connects reach it (not the pod's
// listener), a closed port is ECONNREFUSED from the kernel, and the
// direct-connection counters see every one of them.
func TestLearnedDirectGoesDirect(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4}, "10.77.0.1/32")
	egret := listen(t, e.self, p.ns, listen4.String())
	dst := netip.MustParseAddrPort("10.77.0.1:9443")
	up := listen(t, e.self, p.ns, dst.String())

	// Not learned: redirected.
	c, res := dial(t, p.cg, p.ns, bpftest.Op{Addr: dst.String()})
	if res.Peer != listen4.String() {
		t.Fatalf("before learning: peer %s, want the listener", res.Peer)
	}
	expectAt(t, egret, up)
	c.Close()

	// An hour: the 100 connects below start a process each, which on a
	// loaded machine took over a minute, and an expired entry is
	// redirected again.
	if err := e.l.LearnDirect(p.id, dst, bpfload.DirectTLS, time.Hour); err != nil {
		t.Fatal(err)
	}
	got, err := e.l.LearnedDirect(p.id)
	if err != nil || len(got) != 1 || got[0].Dst != dst || got[0].Protocol != bpfload.DirectTLS {
		t.Fatalf("LearnedDirect = %+v, %v", got, err)
	}

	c, res = dial(t, p.cg, p.ns, bpftest.Op{Addr: dst.String()})
	if res.Peer != dst.String() {
		t.Fatalf("after learning: peer %s, want %s", res.Peer, dst)
	}
	s := expectAt(t, up, egret)
	roundTrip(t, c, s)
	reply := []byte("and back")
	if _, err := s.Write(reply); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, len(reply))); err != nil {
		t.Fatal(err)
	}
	// An abortive close ends the socket (TCP_CLOSE) inside close(2).
	if err := c.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	c.Close()

	// The port closes: the pod's connects are refused by the kernel, as
	// without egret.
	up.Close()
	const n = 100
	refused := 0
	for range n {
		_, res := bpftest.Socket(t, p.cg, p.ns, bpftest.Op{Kind: "dial", Family: unix.AF_INET, Addr: dst.String()})
		if strings.Contains(res.Err, unix.ECONNREFUSED.Error()) {
			refused++
		} else {
			t.Errorf("connect to the closed port: %q", res.Err)
		}
	}
	if refused != n {
		t.Fatalf("%d of %d connects refused", refused, n)
	}

	st, err := e.l.PodDirectStats(p.id)
	if err != nil {
		t.Fatal(err)
	}
	want := bpfload.DirectStats{Connects: n + 1, Established: 1, Failed: n, Resets: n + 1, Closed: 1}
	if st.Connects != want.Connects || st.Established != want.Established || st.Failed != want.Failed ||
		st.Closed != want.Closed || st.Resets < n {
		t.Errorf("direct stats = %+v, want %+v", st, want)
	}
	if st.BytesAcked < uint64(len("hello through egret")) || st.BytesReceived < uint64(len(reply)) {
		t.Errorf("direct stats bytes = %+v", st)
	}

	// Detaching forgets what the pod learned; its counters stay in the
	// node's sums.
	if err := e.l.DetachPodID(p.id); err != nil {
		t.Fatal(err)
	}
	if n, err := e.l.LearnedEntries(); err != nil || n != 0 {
		t.Errorf("entries after detach = %d, %v", n, err)
	}
	node, err := e.l.NodeDirectStats()
	if err != nil || node.Connects != st.Connects || node.Failed != st.Failed {
		t.Errorf("node stats after detach = %+v, %v (pod had %+v)", node, err, st)
	}
}

// An expired entry is redirected again (and deleted by the connect hook).
func TestLearnedDirectExpires(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4, Listen6: listen6})
	egret := listen(t, e.self, p.ns, listen4.String())
	dst := netip.MustParseAddrPort("192.0.2.7:853")
	if err := e.l.LearnDirect(p.id, dst, bpfload.DirectOther, time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	if n, _ := e.l.LearnedEntries(); n != 1 {
		t.Fatalf("entries = %d", n)
	}
	_, res := dial(t, p.cg, p.ns, bpftest.Op{Addr: dst.String()})
	if res.Peer != listen4.String() {
		t.Fatalf("expired entry: peer %s, want the listener", res.Peer)
	}
	expectAt(t, egret)
	if n, _ := e.l.LearnedEntries(); n != 0 {
		t.Errorf("entries after the connect met the expired one = %d", n)
	}
}

// NoLearn: nothing can be learned, and turning it on forgets what was.
func TestNoLearn(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4})
	egret := listen(t, e.self, p.ns, listen4.String())
	dst := netip.MustParseAddrPort("192.0.2.8:5000")
	if err := e.l.LearnDirect(p.id, dst, bpfload.DirectOther, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := e.l.SetPodConfig(p.cg, bpfload.PodConfig{Listen4: listen4, NoLearn: true}); err != nil {
		t.Fatal(err)
	}
	if n, _ := e.l.LearnedEntries(); n != 0 {
		t.Errorf("entries after NoLearn = %d", n)
	}
	if err := e.l.LearnDirect(p.id, dst, bpfload.DirectOther, time.Minute); !errors.Is(err, bpfload.ErrLearningOff) {
		t.Fatalf("LearnDirect with NoLearn: %v", err)
	}
	_, res := dial(t, p.cg, p.ns, bpftest.Op{Addr: dst.String()})
	if res.Peer != listen4.String() {
		t.Fatalf("NoLearn: peer %s, want the listener", res.Peer)
	}
	expectAt(t, egret)
	if err := e.l.LearnDirect(12345678, dst, bpfload.DirectOther, time.Minute); !errors.Is(err, bpfload.ErrLearningOff) {
		t.Fatalf("LearnDirect for a pod not attached: %v", err)
	}
}

// The map stays within its bound however many destinations are learned;
// the latest ones are the ones kept.
func TestLearnedBound(t *testing.T) {
	const max = 1024
	e := setupWith(t, bpfload.Options{LearnedMax: max})
	if e.l.LearnedMax() != max {
		t.Fatalf("LearnedMax = %d", e.l.LearnedMax())
	}
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4}, "10.78.0.1/32")
	const n = 10_000
	var last netip.AddrPort
	for i := range n {
		last = netip.MustParseAddrPort(fmt.Sprintf("10.%d.%d.%d:%d", 100+i%50, i/256%256, i%256, 1000+i))
		if err := e.l.LearnDirect(p.id, last, bpfload.DirectOther, time.Minute); err != nil {
			t.Fatalf("learn %d: %v", i, err)
		}
	}
	got, err := e.l.LearnedEntries()
	if err != nil {
		t.Fatal(err)
	}
	if got > max || got == 0 {
		t.Fatalf("entries after %d learned = %d, bound %d", n, got, max)
	}
	t.Logf("%d destinations learned, %d kept (bound %d)", n, got, max)
	// The latest is kept and still goes direct: its connect reaches the
	// kernel's answer for 10.x (no route in the namespace), not egret.
	listen(t, e.self, p.ns, listen4.String())
	_, res := bpftest.Socket(t, p.cg, p.ns, bpftest.Op{Kind: "dial", Family: unix.AF_INET, Addr: last.String()})
	if !strings.Contains(res.Err, unix.ENETUNREACH.Error()) {
		t.Fatalf("latest learned destination: %+v, want the kernel's network unreachable", res)
	}
}

// A pinned egret_direct of another size is reported as incompatible.
func TestLearnedMaxIncompatible(t *testing.T) {
	e := setupWith(t, bpfload.Options{LearnedMax: 2048})
	_, err := bpfload.Load(bpfload.Options{PinDir: e.pin, LearnedMax: 4096})
	if err == nil || !strings.Contains(err.Error(), "incompatible egret version") {
		t.Fatalf("Load over a differently sized egret_direct: %v", err)
	}
}
