package bpfload_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
	"github.com/egret-proxy/egret/bpf"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/witness"
)

func TestFeatureErrorMatches(t *testing.T) {
	err := fmt.Errorf("agent: %w", &bpfload.FeatureError{Feature: "BPF_MAP_TYPE_RINGBUF", Need: "events"})
	if !errors.Is(err, bpfload.ErrFeature) || errors.Is(err, bpfload.ErrNotRoot) {
		t.Fatalf("errors.Is wrong for %v", err)
	}
	var fe *bpfload.FeatureError
	if !errors.As(err, &fe) || fe.Feature != "BPF_MAP_TYPE_RINGBUF" {
		t.Fatalf("errors.As: %v", err)
	}
}

// A pod cgroup with container cgroups below it: the config is found on the
// nearest ancestor.
func TestRedirectFromContainerCgroup(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4})
	ctr := e.cg.Sub(t, "pod-a/ctr-1")
	egret := listen(t, e.self, p.ns, listen4.String())

	dial(t, ctr, p.ns, bpftest.Op{Addr: "192.0.2.99:80"})
	s := expectAt(t, egret)
	if got := origDst(t, s).String(); got != "192.0.2.99:80" {
		t.Fatalf("original = %s", got)
	}
}

func tupleCount(t testing.TB, e *env) int {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(e.pin, "egret_tuples"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var k bpf.EgretTupleKey
	var v bpf.EgretOrigDst
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// The tuple entry lives while the connection does and goes when the client
// socket closes.
func TestTupleRemovedOnClose(t *testing.T) {
	e := setup(t)
	p := e.pod(t, "pod-a", bpfload.PodConfig{Listen4: listen4})
	egret := listen(t, e.self, p.ns, listen4.String())

	c, _ := dial(t, p.cg, p.ns, bpftest.Op{Addr: "192.0.2.10:80"})
	s := expectAt(t, egret)
	if n := tupleCount(t, e); n != 1 {
		t.Fatalf("tuples while connected = %d, want 1", n)
	}
	c.Close()
	s.Close()
	// Polls: the tuples go when the kernel runs the close hooks, which
	// announce nothing.
	if !testenv.Poll(3*time.Second, func() bool { return tupleCount(t, e) == 0 }) {
		t.Fatalf("tuples after close = %d, want 0", tupleCount(t, e))
	}
}

func TestWitnessResetAfterBytes(t *testing.T) {
	e := setup(t)
	srv := e.upstream(t)
	w := e.l.Witness()
	c, s := upstreamPair(t, e, srv, e.l.Mark())
	before := snapshot(t, w, c)
	if _, err := c.Write(make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	_ = s.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.ReadFull(s, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	_ = s.SetLinger(0)
	s.Close()
	// The client's read ends with the reset: the eBPF program marks it in
	// the tcp_receive_reset tracepoint, before the kernel sets the
	// socket's error and wakes the reader.
	waitReset(t, c)
	after := snapshot(t, w, c)
	if !after.ResetReceived || after.BytesSent != 1000 || witness.NoByteLeft(before, after) {
		t.Fatalf("reset after 1000 bytes: %+v", after)
	}
}

// The upstream stops receiving (an nftables rule in its namespace drops
// its input): the write leaves but is never acknowledged, the
// retransmission timer fires, and the witness counts RTOs and
// retransmissions, with ring buffer events.
func TestWitnessRTOAndRetransmit(t *testing.T) {
	e := setup(t)
	srv := e.upstream(t)
	w := e.l.Witness()
	events, err := e.l.Events()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { events.Close() })
	c, _ := upstreamPair(t, e, srv, e.l.Mark())
	cookie, _ := bpfload.SocketCookie(rawConn(t, c))

	nft(t, e.upNS, "table inet egret_test {\n chain in {\n  type filter hook input priority 0;\n  tcp dport 9100 drop\n }\n}\n")
	if _, err := c.Write([]byte("lost request")); err != nil {
		t.Fatal(err)
	}
	// The ring buffer's events are the sign: the eBPF program counts an
	// RTO or a retransmission in the socket's record before it emits the
	// event, so once both are read the counters show them.
	seen := map[bpfload.EventType]bool{}
	events.SetDeadline(time.Now().Add(8 * time.Second))
	for !seen[bpfload.EventRTO] || !seen[bpfload.EventRetransmit] {
		ev, err := events.Read()
		if err != nil {
			t.Fatalf("events seen %v: %v", seen, err)
		}
		if ev.Cookie == cookie {
			seen[ev.Type] = true
		}
	}
	ctr := snapshot(t, w, c)
	if ctr.RTOs < 1 || ctr.Retransmits < 1 {
		t.Fatalf("no RTO/retransmit recorded: %+v", ctr)
	}
	t.Logf("after RTO: %+v", ctr)
}

// waitReset reads from c until the peer's reset ends the read (as
// ECONNRESET): the event that the kernel has processed the RST.
func waitReset(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if errors.Is(err, syscall.ECONNRESET) {
			return
		}
		if err != nil {
			t.Fatalf("waiting for the reset, the read ended with %v", err)
		}
	}
}

// nft loads a ruleset into the network namespace ns (the table goes with
// the namespace).
func nft(t testing.TB, ns netns.NsHandle, ruleset string) {
	t.Helper()
	path, err := exec.LookPath("nft")
	testenv.Require(t, err == nil, "nft (Debian package nftables)")
	fd, err := unix.FcntlInt(uintptr(ns), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	nsf := os.NewFile(uintptr(fd), "netns")
	defer nsf.Close()
	cmd := exec.Command("nsenter", "--net=/proc/self/fd/3", path, "-f", "-")
	cmd.ExtraFiles = []*os.File{nsf}
	cmd.Stdin = strings.NewReader(ruleset)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
}

func TestMarkControl(t *testing.T) {
	testenv.RequireRoot(t)
	d := net.Dialer{Control: bpfload.MarkControl(0x1234)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mark int
	var serr error
	if err := rawConn(t, c.(*net.TCPConn)).Control(func(fd uintptr) {
		mark, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	if mark != 0x1234 {
		t.Fatalf("SO_MARK = %#x", mark)
	}
}

// Remove leaves nothing: no pins, no programs attached to the pod's or
// egret's cgroups (which still exist), no programs in the kernel.
func TestRemoveLeavesNothing(t *testing.T) {
	testenv.RequireRoot(t)
	cg := bpftest.NewCgroups(t)
	podCg, selfCg := cg.Sub(t, "pod"), cg.Sub(t, "egret")
	pin := filepath.Join(bpfload.BPFFSRoot, bpftest.RandName())
	// Whatever fails below, the pins go (Remove is what is tested).
	t.Cleanup(func() { os.RemoveAll(pin) })
	l, err := bpfload.Load(bpfload.Options{PinDir: pin})
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint32
	for _, id := range l.ProgramIDs() {
		ids = append(ids, uint32(id))
	}
	if _, err := l.AttachPod(podCg, bpfload.PodConfig{Listen4: listen4, ExcludePrefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}); err != nil {
		t.Fatal(err)
	}
	if err := l.AttachSelf(selfCg); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{podCg, selfCg} {
		if got, err := bpftest.AttachedPrograms(c); err != nil || len(got) == 0 {
			t.Fatalf("attached to %s: %v %v", c, got, err)
		}
	}
	if err := l.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := bpftest.NothingLeft(pin, nil, []string{podCg, selfCg}, ids); err != nil {
		t.Fatal(err)
	}
}

func TestSelfCgroup(t *testing.T) {
	p, err := bpfload.SelfCgroup()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bpfload.CgroupID(p); err != nil {
		t.Fatalf("SelfCgroup %s: %v", p, err)
	}
}

// Load mounts bpffs when /sys/fs/bpf has none. Run in a private mount
// namespace (unshare -m) so that the machine's own bpffs is not touched.
func TestLoadMountsBPFFS(t *testing.T) {
	if os.Getenv("EGRET_BPFFS_CHILD") == "1" {
		loadMountsBPFFSChild(t)
		return
	}
	testenv.RequireRoot(t)
	unshare, err := exec.LookPath("unshare")
	testenv.Require(t, err == nil, "unshare (util-linux)")
	cmd := exec.Command(unshare, "-m", "--propagation", "private", os.Args[0], "-test.run=^TestLoadMountsBPFFS$", "-test.v")
	cmd.Env = append(os.Environ(), "EGRET_BPFFS_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("child:\n%s", out)
}

func loadMountsBPFFSChild(t *testing.T) {
	isBPFFS := func() bool {
		var st unix.Statfs_t
		return unix.Statfs(bpfload.BPFFSRoot, &st) == nil && st.Type == unix.BPF_FS_MAGIC
	}
	for i := 0; isBPFFS() && i < 10; i++ {
		if err := unix.Unmount(bpfload.BPFFSRoot, unix.MNT_DETACH); err != nil {
			t.Fatalf("umount in private namespace: %v", err)
		}
	}
	if isBPFFS() {
		t.Fatal("bpffs still mounted")
	}
	pin := filepath.Join(bpfload.BPFFSRoot, bpftest.RandName())
	t.Cleanup(func() { os.RemoveAll(pin) }) // in this private namespace's bpffs; whatever fails
	l, err := bpfload.Load(bpfload.Options{PinDir: pin})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !isBPFFS() {
		t.Fatal("Load did not mount bpffs")
	}
	if _, err := os.Stat(filepath.Join(pin, "egret_pods")); err != nil {
		t.Fatalf("pinned map: %v", err)
	}
	if err := l.Remove(); err != nil {
		t.Fatal(err)
	}
}

// An agent restarted in a new cgroup (a new container) removes the links
// the dead agent pinned for its old cgroup of its own; they would
// otherwise pile up, one set per restart, each holding a dead cgroup.
func TestAttachSelfRemovesEarlierAgentsLinks(t *testing.T) {
	testenv.RequireRoot(t)
	cg := bpftest.NewCgroups(t)
	oldSelf, newSelf := cg.Sub(t, "egret-old"), cg.Sub(t, "egret-new")
	pin := filepath.Join(bpfload.BPFFSRoot, bpftest.RandName())
	// Whatever fails below, the pins go (a dead agent's stay by design).
	t.Cleanup(func() { os.RemoveAll(pin) })
	l1, err := bpfload.Load(bpfload.Options{PinDir: pin})
	if err != nil {
		t.Fatal(err)
	}
	if err := l1.AttachSelf(oldSelf); err != nil {
		t.Fatal(err)
	}
	l1.Close() // the first agent dies; its pins stay
	l2, err := bpfload.Load(bpfload.Options{PinDir: pin})
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint32
	for _, id := range l2.ProgramIDs() {
		ids = append(ids, uint32(id))
	}
	defer func() {
		if err := l2.Remove(); err != nil {
			t.Error(err)
		}
		l2.Close()
		if err := bpftest.NothingLeft(pin, nil, []string{oldSelf, newSelf}, ids); err != nil {
			t.Error(err)
		}
	}()
	if got, err := bpftest.AttachedPrograms(oldSelf); err != nil || len(got) == 0 {
		t.Fatalf("the earlier agent's cgroup before the restart: %v %v", got, err)
	}
	if err := l2.AttachSelf(newSelf); err != nil {
		t.Fatal(err)
	}
	if got, err := bpftest.AttachedPrograms(oldSelf); err != nil || len(got) != 0 {
		t.Fatalf("still attached to the earlier agent's cgroup: %v %v", got, err)
	}
	if got, err := bpftest.AttachedPrograms(newSelf); err != nil || len(got) == 0 {
		t.Fatalf("attached to the new one: %v %v", got, err)
	}
	oldID, _ := bpfload.CgroupID(oldSelf)
	if _, err := os.Stat(filepath.Join(pin, "links", "self", strconv.FormatUint(oldID, 10))); !os.IsNotExist(err) {
		t.Fatalf("the earlier agent's link pins: %v", err)
	}
	// Attaching the same cgroup again keeps it.
	if err := l2.AttachSelf(newSelf); err != nil {
		t.Fatal(err)
	}
	if got, _ := bpftest.AttachedPrograms(newSelf); len(got) == 0 {
		t.Fatal("a second AttachSelf of the same cgroup detached it")
	}
}

// An agent whose container was replaced finds the links its predecessor
// pinned for its own cgroup severed (the kernel detaches a cgroup's links
// when the cgroup is removed), and so are those of a pod deleted while no
// agent ran. Load removes that state and goes on: before, it failed with
// "adopt …: update link: link has been severed" and the DaemonSet's agent
// crash-looped after its first restart on a real node.
func TestLoadRemovesStateOfGoneCgroups(t *testing.T) {
	testenv.RequireRoot(t)
	cg := bpftest.NewCgroups(t)
	oldSelf, gonePod, livePod := cg.Sub(t, "egret-old"), cg.Sub(t, "pod-gone"), cg.Sub(t, "pod-live")
	pin := filepath.Join(bpfload.BPFFSRoot, bpftest.RandName())
	// Whatever fails below, the pins go (a failed Load leaves them).
	t.Cleanup(func() { os.RemoveAll(pin) })
	l1, err := bpfload.Load(bpfload.Options{PinDir: pin})
	if err != nil {
		t.Fatal(err)
	}
	if err := l1.AttachSelf(oldSelf); err != nil {
		t.Fatal(err)
	}
	cfg := bpfload.PodConfig{Listen4: netip.MustParseAddrPort("127.0.0.1:15001"), ExcludePrefixes: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}}
	goneID, err := l1.AttachPod(gonePod, cfg)
	if err != nil {
		t.Fatal(err)
	}
	liveID, err := l1.AttachPod(livePod, cfg)
	if err != nil {
		t.Fatal(err)
	}
	oldID, _ := bpfload.CgroupID(oldSelf)
	l1.Close() // the agent dies; its pins stay
	// Its container's cgroup goes, and so does a pod's.
	for _, c := range []string{oldSelf, gonePod} {
		if err := os.Remove(c); err != nil {
			t.Fatal(err)
		}
	}

	l2, err := bpfload.Load(bpfload.Options{PinDir: pin})
	if err != nil {
		t.Fatalf("Load after the cgroups went: %v", err)
	}
	var ids []uint32
	for _, id := range l2.ProgramIDs() {
		ids = append(ids, uint32(id))
	}
	defer func() {
		if err := l2.Remove(); err != nil {
			t.Error(err)
		}
		l2.Close()
		if err := bpftest.NothingLeft(pin, nil, []string{livePod}, ids); err != nil {
			t.Error(err)
		}
	}()
	stale := l2.Stale()
	want := map[bpfload.StaleCgroup]bool{{Kind: "pod", ID: goneID}: true, {Kind: "self", ID: oldID}: true}
	if len(stale) != len(want) {
		t.Fatalf("Stale() = %v, want %v", stale, want)
	}
	for _, s := range stale {
		if !want[s] {
			t.Fatalf("Stale() = %v, want %v", stale, want)
		}
	}
	for _, p := range []string{
		filepath.Join(pin, "links", "self", strconv.FormatUint(oldID, 10)),
		filepath.Join(pin, "links", "pod", strconv.FormatUint(goneID, 10)),
	} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still pinned: %v", p, err)
		}
	}
	pods, err := l2.Pods()
	if err != nil || len(pods) != 1 || pods[0] != liveID {
		t.Fatalf("Pods() = %v, %v; want only the live pod %d", pods, err, liveID)
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(pin, "egret_pods"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var pc bpf.EgretPodConfig
	if err := m.Lookup(goneID, &pc); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("the gone pod's config: %v", err)
	}
	if err := m.Lookup(liveID, &pc); err != nil {
		t.Errorf("the live pod's config: %v", err)
	}
	// The live pod's links were adopted: still attached, now to l2's programs.
	got, err := bpftest.AttachedPrograms(livePod)
	if err != nil || len(got) != 3 {
		t.Fatalf("live pod's programs: %v %v", got, err)
	}
	mine := map[uint32]bool{}
	for _, id := range ids {
		mine[id] = true
	}
	for _, id := range got {
		if !mine[id] {
			t.Errorf("live pod runs program %d, not the new loader's %v", id, ids)
		}
	}
	if err := l2.DetachPod(livePod); err != nil {
		t.Fatal(err)
	}
}
