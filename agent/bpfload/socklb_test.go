package bpfload_test

import (
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
	"github.com/egret-proxy/egret/agent/bpfload/bpftest/socklb"
)

var (
	lbService = netip.MustParseAddrPort("10.96.0.50:80")
	lbBackend = netip.MustParseAddrPort("192.0.2.20:8080")
)

// socketLB loads the socket load balancer's stand-in (socklb.c) for
// lbService -> lbBackend; its objects are closed in t.Cleanup.
func socketLB(t *testing.T) *socklb.SocklbObjects {
	t.Helper()
	objs, err := socklb.Load(lbService, lbBackend)
	if err != nil {
		t.Fatalf("load the socket LB stand-in: %v", err)
	}
	t.Cleanup(func() { objs.Close() })
	return objs
}

// lbSaw is what the socket LB saw: connects by cgroup id and destination.
func lbSaw(t *testing.T, objs *socklb.SocklbObjects) map[uint64]map[netip.AddrPort]uint64 {
	t.Helper()
	saw, err := socklb.Saw(objs)
	if err != nil {
		t.Fatal(err)
	}
	return saw
}

// TestSocketLBAtAncestor: a CNI's socket load balancer (Cilium's) attaches
// cgroup/connect4 at the cgroup root, beside egret's per-pod programs. The
// stand-in is attached at the test's top cgroup, the ancestor of the pod's
// and of egret's own cgroup, as the root is on a node.
//
// Attached as Cilium attaches (a bpf_link, no ordering flag), the kernel
// runs the pod's own programs first (effective programs: the cgroup's,
// then its parent's, up to the root): egret sees the Service address the
// pod dialled, redirects it to its listener, and the LB sees only
// 127.0.0.1:15001 from the pod; egret's own upstream connect to the
// Service (from egret's cgroup, below the same ancestor) is the one the LB
// sends to the backend. Attached with BPF_F_PREORDER (recent kernels), the
// ancestor's program runs before every descendant's non-preorder program:
// the LB rewrites the pod's connect to the backend first, and egret sees
// the backend.
func TestSocketLBAtAncestor(t *testing.T) {
	e := setup(t)
	lb := socketLB(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4}, lbBackend.Addr().String()+"/32")
	podID, selfID := p.id, mustCgroupID(t, e.self)
	egret := listen(t, e.self, p.ns, listen4.String())
	backend := listen(t, e.self, p.ns, lbBackend.String())

	t.Run("LinkAtAncestorRunsAfterEgret", func(t *testing.T) {
		lk, err := link.AttachCgroup(link.CgroupOptions{Path: e.cg.Top, Attach: ebpf.AttachCGroupInet4Connect, Program: lb.SocklbConnect4})
		if err != nil {
			t.Fatalf("attach the socket LB at %s: %v", e.cg.Top, err)
		}
		defer lk.Close()

		client, res := dial(t, p.cg, p.ns, bpftest.Op{Addr: lbService.String()})
		if res.Peer != listen4.String() {
			t.Errorf("the pod's connect to %s reached %s, want egret's listener %s", lbService, res.Peer, listen4)
		}
		srv := expectAt(t, egret, backend)
		got := origDst(t, srv)
		if got != lbService {
			t.Errorf("egret saw %s as the original destination, want the Service %s", got, lbService)
		}
		roundTrip(t, client, srv)
		// egret's upstream connect, from its own cgroup in the pod's
		// namespace: the LB sends it to the backend.
		up, ures := dial(t, e.self, p.ns, bpftest.Op{Addr: got.String()})
		if ures.Peer != lbBackend.String() {
			t.Errorf("egret's upstream connect to %s reached %s, want the backend %s", got, ures.Peer, lbBackend)
		}
		roundTrip(t, up, expectAt(t, backend, egret))

		saw := lbSaw(t, lb)
		if n := saw[podID][listen4]; n != 1 || saw[podID][lbService] != 0 {
			t.Errorf("the LB saw, from the pod: %v; want egret's listener once, never the Service", saw[podID])
		}
		if n := saw[selfID][lbService]; n != 1 {
			t.Errorf("the LB saw, from egret's cgroup: %v; want the Service once", saw[selfID])
		}
		t.Logf("bpf_link at the ancestor: egret saw %s; the LB saw from the pod %v, from egret %v", got, saw[podID], saw[selfID])
		clearSeen(t, lb)
	})

	t.Run("PreorderAtAncestorRunsBeforeEgret", func(t *testing.T) {
		top, err := os.Open(e.cg.Top)
		if err != nil {
			t.Fatal(err)
		}
		defer top.Close()
		const preorder = 1 << 6 // BPF_F_PREORDER (include/uapi/linux/bpf.h)
		opts := link.RawAttachProgramOptions{Target: int(top.Fd()), Program: lb.SocklbConnect4,
			Attach: ebpf.AttachCGroupInet4Connect, Flags: unix.BPF_F_ALLOW_MULTI | preorder}
		if err := link.RawAttachProgram(opts); err != nil {
			t.Fatalf("attach the socket LB at %s with BPF_F_PREORDER: %v", e.cg.Top, err)
		}
		defer func() {
			if err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: int(top.Fd()), Program: lb.SocklbConnect4, Attach: ebpf.AttachCGroupInet4Connect}); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("detach the socket LB: %v", err)
			}
		}()

		client, res := dial(t, p.cg, p.ns, bpftest.Op{Addr: lbService.String()})
		if res.Peer != listen4.String() {
			t.Errorf("the pod's connect to %s reached %s, want egret's listener %s", lbService, res.Peer, listen4)
		}
		srv := expectAt(t, egret, backend)
		got := origDst(t, srv)
		if got != lbBackend {
			t.Errorf("egret saw %s as the original destination, want the backend %s (the LB ran first)", got, lbBackend)
		}
		roundTrip(t, client, srv)
		saw := lbSaw(t, lb)
		if saw[podID][lbService] != 1 || saw[podID][listen4] != 0 {
			t.Errorf("the LB saw, from the pod: %v; want the Service once, never egret's listener", saw[podID])
		}
		t.Logf("BPF_F_PREORDER at the ancestor: egret saw %s; the LB saw from the pod %v", got, saw[podID])
	})
}

func clearSeen(t *testing.T, lb *socklb.SocklbObjects) {
	t.Helper()
	if err := socklb.ClearSaw(lb); err != nil {
		t.Fatal(err)
	}
}

func mustCgroupID(t *testing.T, path string) uint64 {
	t.Helper()
	id, err := bpfload.CgroupID(path)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
