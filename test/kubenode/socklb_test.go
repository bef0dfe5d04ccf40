package kubenode_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/bpfload/bpftest/socklb"
	"github.com/egret-proxy/egret/test/kubenode"
)

// lbServiceOnNode is the address the stand-in socket LB translates: a
// ClusterIP-like address no Service of the node has, so that only the LB
// (and not kube-proxy) can send a connect to it anywhere.
var lbServiceOnNode = netip.MustParseAddrPort("10.96.200.200:80")

// TestSocketLBOnNode: a CNI's socket load balancer (Cilium's kube-proxy
// replacement) attaches cgroup/connect4 above every pod, beside egret's
// per-pod programs. On the real node the stand-in (bpftest/socklb) is
// attached as a bpf_link, no ordering flag, at the kubelet's pods cgroup
// (kubepods, the ancestor of every pod's and of the agent's cgroup), to
// translate lbServiceOnNode to the ledger. An opted-in pod's request to
// the Service address is seen by egret as the Service (the pod's own
// programs run first): the LB sees only egret's listener from the pod, and
// the Service from the agent's cgroup when egret dials it, which it sends
// to the ledger; the request is retried by egret as usual. The order the
// kernel gives (and BPF_F_PREORDER's) is agent/bpfload's
// TestSocketLBAtAncestor.
func TestSocketLBOnNode(t *testing.T) {
	c := startCluster(t, "egret-socklb", true)
	c.installEgret(t)
	c.newPod(t, "client", []string{"pause"}, optIn)
	t.Cleanup(func() { c.deletePod(t, "client") })
	c.n.WaitPod(t, c.ns, "client", 2*time.Minute, "Ready", kubenode.PodReady)
	c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/client")

	ap := c.agentPod(t)
	list, err := c.agentPods(t, ap)
	if err != nil {
		t.Fatal(err)
	}
	st := list[c.ns+"/client"]
	if st.CgroupID == 0 || len(st.Listen) == 0 {
		t.Fatalf("the agent's view of the client pod: %+v", st)
	}
	root := podsCgroup2(t)
	agentCg := procCgroup2(t, agentPID(t, c, ap), filepath.Dir(root))
	agentID, err := bpfload.CgroupID(agentCg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(agentCg, root+"/") {
		t.Fatalf("the agent's cgroup %s is not under the pods' %s", agentCg, root)
	}

	backend := netip.MustParseAddrPort(kubenode.IP + ":" + ledgerPort)
	lb, err := socklb.Load(lbServiceOnNode, backend)
	if err != nil {
		t.Fatalf("load the socket LB stand-in: %v", err)
	}
	t.Cleanup(func() { lb.Close() })
	lk, err := link.AttachCgroup(link.CgroupOptions{Path: root, Attach: ebpf.AttachCGroupInet4Connect, Program: lb.SocklbConnect4})
	if err != nil {
		t.Fatalf("attach the socket LB at %s: %v", root, err)
	}
	detach := sync.OnceValue(lk.Close)
	t.Cleanup(func() { detach() })

	id := kubenode.RandName("socklb-")
	r := parseResponse(t, c.exec(t, "client", "get", "http://"+lbServiceOnNode.String()+"/hello",
		"Ledger-Id: "+id, "Ledger-Fault: 503; times=1"))
	if !strings.Contains(r.status, "200") || r.headers["Egret-Attempts"] != "2" {
		t.Fatalf("GET the Service address: %s, Egret-Attempts %q (headers %v, body %q); want 200 after egret's retry",
			r.status, r.headers["Egret-Attempts"], r.headers, r.body)
	}
	if got := c.led.Executions(id); got != 2 {
		t.Errorf("the ledger executed %s %d times, want 2", id, got)
	}

	saw := socketLBSaw(t, lb)
	listen := map[netip.AddrPort]bool{}
	for _, l := range st.Listen {
		if ap, err := netip.ParseAddrPort(l); err == nil {
			listen[ap] = true
		}
	}
	// The pod's processes are in its containers' cgroups, below the pod's.
	podIDs := cgroupIDsUnder(t, st.Cgroup)
	fromPod := map[netip.AddrPort]uint64{}
	for cg, dsts := range saw {
		for dst, k := range dsts {
			switch {
			case podIDs[cg]:
				fromPod[dst] += k
				if !listen[dst] {
					t.Errorf("the LB saw the pod (cgroup %d) connect to %s (%d times): want only egret's listener %v", cg, dst, k, st.Listen)
				}
			case cg != agentID && dst == lbServiceOnNode:
				// Other pods (CoreDNS's health check) connect too, but
				// none to the Service address.
				t.Errorf("the LB saw cgroup %d, neither the pod's nor the agent's, connect to %s", cg, dst)
			}
		}
	}
	if len(fromPod) == 0 {
		t.Errorf("the LB saw no connect of the pod (cgroups %v): %v", podIDs, saw)
	}
	if saw[agentID][lbServiceOnNode] == 0 {
		t.Errorf("the LB never saw egret's agent (cgroup %d) dial the Service %s: %v", agentID, lbServiceOnNode, saw)
	}
	t.Logf("socket LB at %s (bpf_link): from the pod it saw %v, from the agent %v; GET %s: %s after %s attempts, %d executions",
		root, fromPod, saw[agentID], lbServiceOnNode, r.status, r.headers["Egret-Attempts"], c.led.Executions(id))

	// The same LB asking to run first (BPF_F_PREORDER, kernels since
	// 2025): it translates the pod's connect before egret's program sees
	// it, and egret sees the backend.
	if err := detach(); err != nil {
		t.Fatal(err)
	}
	clearSocketLBSaw(t, lb)
	top, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer top.Close()
	const preorder = 1 << 6 // BPF_F_PREORDER (include/uapi/linux/bpf.h)
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: int(top.Fd()), Program: lb.SocklbConnect4,
		Attach: ebpf.AttachCGroupInet4Connect, Flags: unix.BPF_F_ALLOW_MULTI | preorder}); err != nil {
		t.Fatalf("attach the socket LB at %s with BPF_F_PREORDER: %v", root, err)
	}
	defer func() {
		if err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: int(top.Fd()), Program: lb.SocklbConnect4,
			Attach: ebpf.AttachCGroupInet4Connect}); err != nil {
			t.Errorf("detach the socket LB: %v", err)
		}
	}()
	id = kubenode.RandName("socklb-pre-")
	r = parseResponse(t, c.exec(t, "client", "get", "http://"+lbServiceOnNode.String()+"/hello",
		"Ledger-Id: "+id, "Ledger-Fault: 503; times=1"))
	if !strings.Contains(r.status, "200") || r.headers["Egret-Attempts"] != "2" {
		t.Fatalf("GET the Service address, LB in preorder: %s, Egret-Attempts %q (headers %v, body %q)",
			r.status, r.headers["Egret-Attempts"], r.headers, r.body)
	}
	saw = socketLBSaw(t, lb)
	fromPod = map[netip.AddrPort]uint64{}
	for cg, dsts := range saw {
		if podIDs[cg] {
			for dst, k := range dsts {
				fromPod[dst] += k
			}
		}
	}
	if fromPod[lbServiceOnNode] == 0 || len(fromPod) != 1 {
		t.Errorf("LB in preorder: it saw from the pod %v; want the Service only (it runs before egret)", fromPod)
	}
	if saw[agentID][lbServiceOnNode] != 0 {
		t.Errorf("LB in preorder: egret's agent dialled the Service %v; want the backend the LB chose", saw[agentID])
	}
	t.Logf("socket LB at %s with BPF_F_PREORDER: from the pod it saw %v, from the agent %v (egret saw the backend): %s after %s attempts",
		root, fromPod, saw[agentID], r.status, r.headers["Egret-Attempts"])
}

// clearSocketLBSaw empties what the stand-in saw.
func clearSocketLBSaw(t testing.TB, lb *socklb.SocklbObjects) {
	t.Helper()
	if err := socklb.ClearSaw(lb); err != nil {
		t.Fatal(err)
	}
}

// podsCgroup2 is the kubelet's pods cgroup in the cgroup v2 hierarchy.
func podsCgroup2(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"/sys/fs/cgroup/unified/kubepods", "/sys/fs/cgroup/kubepods"} {
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			if _, err := os.Stat(filepath.Join(filepath.Dir(p), "cgroup.controllers")); err == nil {
				return p
			}
		}
	}
	t.Fatal("no kubepods cgroup in a cgroup v2 hierarchy")
	return ""
}

// procCgroup2 is the cgroup v2 directory of process pid, under the
// hierarchy mounted at mount.
func procCgroup2(t testing.TB, pid int, mount string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return filepath.Join(mount, p)
		}
	}
	t.Fatalf("process %d has no cgroup v2 line: %q", pid, b)
	return ""
}

// cgroupIDsUnder are the ids of dir's cgroup and its descendants.
func cgroupIDsUnder(t testing.TB, dir string) map[uint64]bool {
	t.Helper()
	ids := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		id, err := bpfload.CgroupID(p)
		if err != nil {
			return err
		}
		ids[id] = true
		return nil
	})
	if err != nil {
		t.Fatalf("the pod's cgroups under %s: %v", dir, err)
	}
	return ids
}

// socketLBSaw is what the stand-in saw: connects by cgroup id and
// destination.
func socketLBSaw(t testing.TB, lb *socklb.SocklbObjects) map[uint64]map[netip.AddrPort]uint64 {
	t.Helper()
	saw, err := socklb.Saw(lb)
	if err != nil {
		t.Fatal(err)
	}
	return saw
}
