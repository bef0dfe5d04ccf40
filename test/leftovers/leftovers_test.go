package leftovers

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// TestCheckerSeesWhatATestLeaves makes one object of each kind the checker
// knows and shows that the diff reports each, then removes them and shows
// that the diff no longer does. The host's own objects (a named netns
// with its nsfs mount, a cgroup, a bpffs pin) are made on the host; the
// network's (a veth pair, an nft table, an iptables chain) inside that
// netns, which stands in for a host that has never run iptables: it has
// no "ip filter" table, and the chain's first `iptables -N` makes one
// (with iptables' nft backend). The test must remove that table too, the
// way every test must remove what it caused to exist, and the checker
// must see it while it is there. Nothing of the host's own network state
// is touched. Other work on the machine may make state meanwhile: only
// this test's names are looked at on the host.
func TestCheckerSeesWhatATestLeaves(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tool := range []string{"ip", "nft", "iptables", "iptables-save", "nsenter"} {
		_, err := exec.LookPath(tool)
		testenv.Require(t, err == nil, tool+" on PATH")
	}
	b := make([]byte, 3)
	rand.Read(b)
	name := "egret-lo-" + hex.EncodeToString(b) // 15 bytes: an interface name's limit
	peer := strings.Replace(name, "-lo-", "-lp-", 1)
	chain := strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	nsPath := "/run/netns/" + name
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	in := func(args ...string) { t.Helper(); run(append([]string{"ip", "netns", "exec", name}, args...)...) }
	cg := filepath.Join(cgroup2.Root(), name)
	// The pin goes on the host's bpffs where one is mounted; a fresh
	// machine has none, and then on a bpffs of the test's own, mounted
	// for it and gone with it (the mount is one more object to see).
	bpffs, ownMount := "/sys/fs/bpf", ""
	var st unix.Statfs_t
	if err := unix.Statfs(bpffs, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		bpffs = t.TempDir()
		ownMount = bpffs
	}
	pinDir := filepath.Join(bpffs, name)
	pin := filepath.Join(pinDir, "map")
	// Every removal is registered before its object is made, so that a
	// failure half way removes what was made; the netns takes its links,
	// tables and chains with it.
	removeHost := func() {
		exec.Command("ip", "netns", "del", name).Run()
		os.Remove(cg)
		os.Remove(pin)
		os.Remove(pinDir)
		if ownMount != "" {
			unix.Unmount(ownMount, 0)
		}
	}
	t.Cleanup(removeHost)

	hostBefore := Take()
	if len(hostBefore.Errors) > 0 {
		t.Fatalf("snapshot errors: %v", hostBefore.Errors)
	}
	run("ip", "netns", "add", name)
	netBefore := TakeIn(nsPath)
	if len(netBefore.Errors) > 0 {
		t.Fatalf("snapshot errors in %s: %v", name, netBefore.Errors)
	}
	if slices.Contains(netBefore.Items, "nft table ip filter") {
		t.Fatalf("a new netns already has table ip filter: %q", netBefore.Items)
	}

	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	if ownMount != "" {
		if err := unix.Mount("bpf", ownMount, "bpf", 0, ""); err != nil {
			t.Fatalf("bpffs at %s: %v", ownMount, err)
		}
	}
	if err := os.Mkdir(pinDir, 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}
	// A veth pair (this kernel may lack the dummy driver): both ends
	// are leftovers until the pair goes.
	in("ip", "link", "add", name, "type", "veth", "peer", "name", peer)
	in("nft", "add", "table", "inet", name)
	in("iptables", "-w", "-N", chain)
	version, _ := exec.Command("iptables", "-V").Output()
	nftBackend := strings.Contains(string(version), "nf_tables")

	mine := func(items []string) []string {
		var out []string
		for _, it := range items {
			if strings.Contains(it, name) || strings.Contains(it, peer) || strings.Contains(it, chain) {
				out = append(out, it)
			}
		}
		return out
	}
	// The netns's own state: what TakeIn reads there (its other items are
	// the host's, compared above).
	network := func(items []string) []string {
		return slices.DeleteFunc(items, func(it string) bool {
			kind, _, _ := strings.Cut(it, " ")
			return kind != "link" && kind != "nft" && kind != "iptables" && kind != "ip6tables"
		})
	}
	expect := func(got, want []string) {
		t.Helper()
		for _, w := range want {
			if !slices.ContainsFunc(got, func(g string) bool { return strings.HasPrefix(g, w) }) {
				t.Errorf("the diff lacks %q; it has:\n%s", w, strings.Join(got, "\n"))
			}
		}
	}
	hostWant := []string{
		"cgroup " + cg,
		"mount " + nsPath + " nsfs nsfs",
		"netns " + name,
		"pin " + pin,
	}
	hostGot := mine(New(hostBefore, Take()))
	if ownMount != "" {
		hostWant = append(hostWant, "mount "+ownMount+" bpf bpf")
		hostGot = append(hostGot, slices.DeleteFunc(New(hostBefore, Take()), func(it string) bool {
			return !strings.HasPrefix(it, "mount "+ownMount+" ")
		})...)
	}
	expect(hostGot, hostWant)
	netWant := []string{
		"iptables filter :" + chain + " -",
		"link " + name,
		"link " + peer,
		"nft table inet " + name,
	}
	if nftBackend {
		netWant = append(netWant, "nft table ip filter")
	}
	expect(network(New(netBefore, TakeIn(nsPath))), netWant)

	// Removing what the test made by name leaves the table its first
	// chain made: the checker says so (the fault CI met on a fresh host).
	in("ip", "link", "del", name)
	in("nft", "delete", "table", "inet", name)
	in("iptables", "-w", "-X", chain)
	left := network(New(netBefore, TakeIn(nsPath)))
	if nftBackend && !slices.Equal(left, []string{"nft table ip filter"}) {
		t.Errorf("after removing the chain by name, the diff is %q, want only the table the chain made", left)
	}
	// What the test caused to exist goes too, and only that: the table
	// only because it was not there before.
	if !slices.Contains(netBefore.Items, "nft table ip filter") {
		exec.Command("ip", "netns", "exec", name, "nft", "delete", "table", "ip", "filter").Run()
	}
	if left := network(New(netBefore, TakeIn(nsPath))); len(left) > 0 {
		t.Errorf("still reported in the netns after the removal:\n%s", strings.Join(left, "\n"))
	}

	removeHost()
	if left := slices.DeleteFunc(New(hostBefore, Take()), func(it string) bool {
		return !strings.Contains(it, name) && !strings.Contains(it, peer) &&
			(ownMount == "" || !strings.HasPrefix(it, "mount "+ownMount+" "))
	}); len(left) > 0 {
		t.Errorf("still reported after the removal:\n%s", strings.Join(left, "\n"))
	}
}

// TestSnapshotParts checks the parts of a snapshot that need no root: the
// iptables listing without counters and built-in chains, and mountinfo's
// escapes.
func TestSnapshotParts(t *testing.T) {
	got := iptablesRules([]string{
		"# Generated by iptables-save",
		"*filter",
		":INPUT ACCEPT [10:20]",
		":EGRET - [0:0]",
		"[3:4] -A EGRET -j RETURN",
		"COMMIT",
	})
	want := []string{"filter :EGRET -", "filter -A EGRET -j RETURN"}
	if !slices.Equal(got, want) {
		t.Errorf("iptables rules %q, want %q", got, want)
	}
	if got := unescape(`/run/a\040b\134`); got != `/run/a b\` {
		t.Errorf("unescape: %q", got)
	}
	a := Snapshot{Items: []string{"link a", "link b"}}
	b := Snapshot{Items: []string{"link b", "link c"}}
	if got := New(a, b); !slices.Equal(got, []string{"link c"}) {
		t.Errorf("New: %q", got)
	}
}
