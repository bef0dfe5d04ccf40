// Package leftovers snapshots the kernel state a test can make on the host
// (named network namespaces, network interfaces, cgroup directories: v2,
// and v1 on a hybrid host; bpffs pins, mounts, nft tables, iptables rules)
// and diffs two snapshots, so that CI can show that a test run left
// nothing behind.
//
// A snapshot is a set of lines, one per object, each starting with its
// kind ("link eth0", "cgroup /sys/fs/cgroup/unified/egret-run-1f2e/cmd").
// What a test removed is not reported: only what is in the later snapshot
// and not in the earlier one. Mount lines carry no mount ids, so a mount
// made again at the same place with the same source is the same object;
// iptables lines carry no counters.
package leftovers

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/egret-proxy/egret/internal/cgroup2"
)

// Snapshot is the host's kernel state at one time: Items, sorted, and the
// parts that could not be read (a missing nft, say) in Errors.
type Snapshot struct {
	Items  []string `json:"items"`
	Errors []string `json:"errors,omitempty"`
}

// Take reads the host's state now.
func Take() Snapshot { return TakeIn("") }

// TakeIn reads the state now, with the parts that belong to a network
// namespace (links, nft tables, iptables rules) read inside the one
// bind-mounted at netns ("/run/netns/NAME"); "" is this process's own.
// The rest (named namespaces, mounts, cgroups, pins) is the host's
// whatever netns says. A test uses it to stand a scratch namespace in for
// the host, so that what it checks is a network state it made itself.
func TakeIn(netns string) Snapshot {
	var s Snapshot
	add := func(kind string, items []string, err error) {
		for _, it := range items {
			s.Items = append(s.Items, kind+" "+it)
		}
		if err != nil {
			s.Errors = append(s.Errors, kind+": "+err.Error())
		}
	}
	named, err := namedNetns()
	add("netns", named, err)
	links, err := links(netns)
	add("link", links, err)
	mounts, bpffs, cgroupfs, err := mounts()
	add("mount", mounts, err)
	// The cgroup v2 tree, and the v1 hierarchies beside it on a hybrid
	// host (the kubelet makes kubepods in each).
	for _, root := range append([]string{cgroup2.Root()}, cgroupfs...) {
		cgs, err := cgroups(root)
		add("cgroup", cgs, err)
	}
	for _, root := range bpffs {
		pins, err := walk(root, false)
		add("pin", pins, err)
	}
	tables, err := command(netns, "nft", "list", "tables")
	add("nft", tables, err)
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		rules, err := command(netns, save)
		add(strings.TrimSuffix(save, "-save"), iptablesRules(rules), err)
	}
	slices.Sort(s.Items)
	s.Items = slices.Compact(s.Items)
	return s
}

// New returns the items of after that before lacks, sorted.
func New(before, after Snapshot) []string {
	had := make(map[string]bool, len(before.Items))
	for _, it := range before.Items {
		had[it] = true
	}
	var out []string
	for _, it := range after.Items {
		if !had[it] {
			out = append(out, it)
		}
	}
	return out
}

// Write stores s as JSON in path.
func (s Snapshot) Write(path string) error {
	b, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Read loads a snapshot that Write stored.
func Read(path string) (Snapshot, error) {
	var s Snapshot
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// namedNetns lists /run/netns, where `ip netns add` (and anything that
// names a namespace as it does) bind-mounts them.
func namedNetns() ([]string, error) {
	ents, err := os.ReadDir("/run/netns")
	if os.IsNotExist(err) {
		return nil, nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, err
}

// links lists the interfaces of the network namespace at netns (this
// process's for "") by name.
func links(netns string) ([]string, error) {
	if netns != "" {
		return linksIn(netns)
	}
	ents, err := os.ReadDir("/sys/class/net")
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, err
}

// cgroups lists every directory of the cgroup v2 hierarchy at root.
func cgroups(root string) ([]string, error) { return walk(root, true) }

// walk lists the paths under root (root itself left out): directories
// only, or files (and directories holding none) only.
func walk(root string, dirs bool) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed while walked
			}
			return err
		}
		if p == root {
			return nil
		}
		if d.IsDir() == dirs {
			out = append(out, p)
		}
		return nil
	})
	return out, err
}

// mounts lists this process's mounts as "POINT TYPE SOURCE ROOT" (no ids,
// which change when a mount is made again), the bpffs mount points and
// the cgroup v1 ones.
func mounts() (lines, bpffs, cgroupfs []string, err error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, nil, nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 2 {
			continue
		}
		point, typ := unescape(f[4]), g[0]
		lines = append(lines, fmt.Sprintf("%s %s %s %s", point, typ, g[1], f[3]))
		switch typ {
		case "bpf":
			bpffs = append(bpffs, point)
		case "cgroup":
			cgroupfs = append(cgroupfs, point)
		}
	}
	slices.Sort(bpffs)
	slices.Sort(cgroupfs)
	return lines, slices.Compact(bpffs), slices.Compact(cgroupfs), sc.Err()
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%3o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// linksIn lists the interfaces of the network namespace at path by name,
// through a netlink socket opened in it.
func linksIn(path string) ([]string, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	ls, err := h.LinkList()
	var out []string
	for _, l := range ls {
		out = append(out, l.Attrs().Name)
	}
	return out, err
}

// command runs a listing command, inside the network namespace at netns
// (through nsenter) unless it is ""; a command this host lacks lists
// nothing (it cannot have made anything either).
func command(netns, name string, args ...string) ([]string, error) {
	if _, err := exec.LookPath(name); err != nil {
		return nil, nil
	}
	cmd := exec.Command(name, args...)
	if netns != "" {
		cmd = exec.Command("nsenter", append([]string{"--net=" + netns, "--", name}, args...)...)
	}
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var lines []string
	for l := range strings.Lines(string(out)) {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

var (
	counters = regexp.MustCompile(`\[\d+:\d+\]`)
	builtin  = map[string]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}
)

// iptablesRules keeps the tables, chains and rules of an iptables-save
// listing without its comments and packet counters; each rule is prefixed
// with its table.
func iptablesRules(lines []string) []string {
	var out []string
	table := ""
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "#"), l == "COMMIT":
		case strings.HasPrefix(l, ":") && builtin[strings.Fields(l[1:])[0]]:
			// A built-in chain exists once its table is loaded, and
			// stays: not a test's leftover (its rules are listed).
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		default:
			out = append(out, table+" "+strings.TrimSpace(counters.ReplaceAllString(l, "")))
		}
	}
	return out
}

// Wait takes snapshots until nothing is new against before, or for at most
// d: it returns what is still new and the last snapshot. The kernel lets
// go of some objects a moment after their owner (a netns's interfaces
// after its last reference, a cgroup once its last process is reaped),
// and tells no one: a poll with a deadline is all there is.
//
// Objects that match one of ignore are left out.
func Wait(before Snapshot, d time.Duration, ignore ...*regexp.Regexp) ([]string, Snapshot) {
	deadline := time.Now().Add(d)
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		after := Take()
		left := slices.DeleteFunc(New(before, after), func(it string) bool {
			return slices.ContainsFunc(ignore, func(re *regexp.Regexp) bool { return re.MatchString(it) })
		})
		if len(left) == 0 || time.Now().After(deadline) {
			return left, after
		}
		time.Sleep(pause)
	}
}
