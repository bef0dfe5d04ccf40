// Package bpfload loads egret's eBPF programs (package bpf), pins them
// under a bpffs directory, attaches them to pod cgroups and to egret's own
// cgroup, and exposes the kernel witness of egret's upstream sockets.
//
// Kernel requirements (all checked by Probe and Load, each missing one is a
// *FeatureError naming it, matched by errors.Is(err, ErrFeature)):
// cgroup v2, BPF_PROG_TYPE_CGROUP_SOCK_ADDR (connect4/6, Linux 4.17),
// BPF_PROG_TYPE_SOCK_OPS with header-option callbacks (5.10),
// BPF_PROG_TYPE_CGROUP_SOCKOPT (5.3), BPF_MAP_TYPE_SK_STORAGE (5.2),
// BPF_MAP_TYPE_RINGBUF (5.8), kernel BTF and tp_btf (5.5, with
// bpf_get_netns_cookie in sockops and sockopt programs: 5.15), and
// bpf_link for cgroups (5.7). On an older kernel Load returns the
// FeatureError of the first thing missing and attaches nothing; the proxy
// then keeps its TCP_INFO witness and pods are not redirected.
//
// Pinned layout under Options.PinDir (default /sys/fs/bpf/egret):
//
//	egret_*                       maps (pinned by name, adopted on restart)
//	links/trace/<program>         tp_btf links (global)
//	links/self/<cgroup id>/<prog> getsockopt + sockops on egret's cgroup
//	links/pod/<cgroup id>/<prog>  connect4, connect6, sockops on a pod cgroup
//
// Pinned links outlive the agent. While the agent is down a pod's connects
// still run connect4/6, which redirect only while an agent serves (the
// socket its Loader put in egret_alive with SetAlive: the kernel drops it
// when the socket closes, so when the agent exits or is killed) and the pod's egret listener exists
// in the pod's network namespace (a socket lookup per connect), so connects
// go direct until the agent runs and listens again (fail-open). Connects
// queued on a listener when the agent died stay queued while `egret
// keeper` holds the listener, and the next agent serves them.
package bpfload

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/bpf"
	"github.com/egret-proxy/egret/internal/cgroup2"
)

const (
	// DefaultPinDir is where Load pins maps and links.
	DefaultPinDir = "/sys/fs/bpf/egret"
	// DefaultMark is the SO_MARK egret sets on its own upstream sockets.
	// Sockets with this mark are never redirected and are the only ones the
	// witness tracks. Chosen to avoid the bits kube-proxy (0x4000, 0x8000),
	// Calico (0xffff0000) and Istio (1337) use.
	DefaultMark uint32 = 0xe6
	// BPFFSRoot is where bpffs is mounted if it is not already.
	BPFFSRoot = "/sys/fs/bpf"
)

// Options configure Load.
type Options struct {
	// PinDir is the bpffs directory for maps and links; DefaultPinDir if
	// empty. Two agents must not share one.
	PinDir string
	// Mark is the SO_MARK of egret's upstream sockets; DefaultMark if 0.
	Mark uint32
	// LearnedMax sizes egret_direct, the learned-direct destinations of
	// all pods together (DefaultLearnedMax if 0). A pin directory whose
	// egret_direct has another size makes Load fail with
	// ErrMapIncompatible, as any layout change does.
	LearnedMax uint32
}

// Loader owns the loaded programs and the pinned state.
type Loader struct {
	pinDir string
	mark   uint32

	mu    sync.Mutex
	objs  bpf.EgretObjects
	trace map[string]link.Link
	stale []StaleCgroup
	// aliveFD is the socket in egret_alive (SetAlive); -1 if none.
	aliveFD int
	closed  bool

	// directMu guards retiredDirect: the learned-direct counters of the
	// pods detached by this Loader (NodeDirectStats).
	directMu      sync.Mutex
	retiredDirect DirectStats
	// retiredFlows: the flow outcomes of the pods detached by this
	// Loader, by path (NodeFlows), also guarded by directMu.
	retiredFlows map[FlowPath]FlowStats
}

// Probe checks, without loading egret's programs, that the kernel has every
// feature egret needs. It returns ErrNotRoot or a *FeatureError.
func Probe() error {
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return &FeatureError{Feature: "kernel BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)", Need: "tp_btf witness programs", Err: err}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cgroup2.Root(), &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		if err == nil {
			err = fmt.Errorf("%s is not cgroup2", cgroup2.Root())
		}
		return &FeatureError{Feature: "cgroup v2 at " + cgroup2.Root(), Need: "per-pod attachment", Err: err}
	}
	progs := []struct {
		t    ebpf.ProgramType
		name string
		need string
	}{
		{ebpf.CGroupSockAddr, "BPF_PROG_TYPE_CGROUP_SOCK_ADDR", "connect4/connect6 redirection"},
		{ebpf.SockOps, "BPF_PROG_TYPE_SOCK_OPS", "original-destination tuples and the witness"},
		{ebpf.CGroupSockopt, "BPF_PROG_TYPE_CGROUP_SOCKOPT", "answering SO_ORIGINAL_DST"},
	}
	// tp_btf is not probed here: the library's probe for tracing programs
	// loads an fentry program, which some platforms refuse while allowing
	// tp_btf. Load reports a missing tp_btf when attaching it.
	for _, p := range progs {
		if err := features.HaveProgramType(p.t); err != nil {
			return &FeatureError{Feature: p.name, Need: p.need, Err: err}
		}
	}
	maps := []struct {
		t    ebpf.MapType
		name string
		need string
	}{
		{ebpf.SkStorage, "BPF_MAP_TYPE_SK_STORAGE", "per-socket records"},
		{ebpf.RingBuf, "BPF_MAP_TYPE_RINGBUF", "witness events"},
		{ebpf.LPMTrie, "BPF_MAP_TYPE_LPM_TRIE", "excluded CIDRs"},
		{ebpf.LRUHash, "BPF_MAP_TYPE_LRU_HASH", "original-destination tuples"},
	}
	for _, m := range maps {
		if err := features.HaveMapType(m.t); err != nil {
			return &FeatureError{Feature: m.name, Need: m.need, Err: err}
		}
	}
	return nil
}

// Load probes the kernel, mounts bpffs if needed, loads egret's programs
// with their maps pinned in opts.PinDir (adopting maps already pinned there
// by an earlier agent), sets the node-wide mark and attaches the global
// tp_btf witness programs. Pod and self attachments already pinned stay in
// place and are switched to the freshly loaded programs.
//
// Close releases the Loader's file descriptors and leaves the pinned state
// (restart); Remove detaches and unpins everything.
func Load(opts Options) (*Loader, error) {
	if err := Probe(); err != nil {
		return nil, err
	}
	if opts.PinDir == "" {
		opts.PinDir = DefaultPinDir
	}
	if opts.Mark == 0 {
		opts.Mark = DefaultMark
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("bpfload: memlock rlimit: %w", err)
	}
	if err := ensureBPFFS(filepath.Dir(opts.PinDir)); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.PinDir, 0o700); err != nil {
		return nil, fmt.Errorf("bpfload: %w", err)
	}

	spec, err := bpf.LoadEgret()
	if err != nil {
		return nil, fmt.Errorf("bpfload: parse embedded object: %w", err)
	}
	if opts.LearnedMax != 0 {
		spec.Maps[bpf.EgretMapEgretDirect].MaxEntries = opts.LearnedMax
	}
	l := &Loader{pinDir: opts.PinDir, mark: opts.Mark, trace: map[string]link.Link{}, aliveFD: -1}
	err = spec.LoadAndAssign(&l.objs, &ebpf.CollectionOptions{
		Maps: ebpf.MapOptions{PinPath: opts.PinDir},
	})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, &FeatureError{Feature: "verifier accepting egret's programs", Need: "all of egret's eBPF", Err: err}
		}
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("bpfload: maps pinned in %s come from an incompatible egret version (remove them with the old agent or by hand): %w", opts.PinDir, err)
		}
		return nil, fmt.Errorf("bpfload: load: %w", err)
	}
	if err := l.objs.EgretGlobals.Put(uint32(0), bpf.EgretGlobals{Mark: opts.Mark}); err != nil {
		l.objs.Close()
		return nil, fmt.Errorf("bpfload: set mark: %w", err)
	}
	if err := l.attachTrace(); err != nil {
		l.Close()
		return nil, err
	}
	if err := l.updatePinnedCgroupLinks(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// PinDir returns the bpffs directory of this loader.
func (l *Loader) PinDir() string { return l.pinDir }

// Mark returns the SO_MARK egret's upstream sockets must carry.
func (l *Loader) Mark() uint32 { return l.mark }

func ensureBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	// The pin directory's parent is not bpffs: mount one at BPFFSRoot (the
	// only place we mount), then check again.
	if err := mountBPFFS(); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bpfload: %w", err)
	}
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		return &FeatureError{Feature: "bpffs at " + dir, Need: "pinning", Err: err}
	}
	return nil
}

// mountBPFFS mounts bpffs at BPFFSRoot unless one is there. The check and
// the mount happen under an flock on the directory as it is before the
// mount, so concurrent loaders (parallel test binaries on a fresh machine)
// do not stack two mounts.
func mountBPFFS() error {
	var st unix.Statfs_t
	if err := unix.Statfs(BPFFSRoot, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(BPFFSRoot, 0o755); err != nil {
		return &FeatureError{Feature: "bpffs", Need: "pinning", Err: err}
	}
	d, err := os.Open(BPFFSRoot)
	if err != nil {
		return &FeatureError{Feature: "bpffs", Need: "pinning", Err: err}
	}
	defer d.Close()
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("bpfload: lock %s: %w", BPFFSRoot, err)
	}
	defer unix.Flock(int(d.Fd()), unix.LOCK_UN)
	if err := unix.Statfs(BPFFSRoot, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", BPFFSRoot, "bpf", 0, "mode=0700"); err != nil {
		return &FeatureError{Feature: "bpffs (mount -t bpf bpf " + BPFFSRoot + ")", Need: "pinning", Err: err}
	}
	return nil
}

func (l *Loader) tracePrograms() map[string]*ebpf.Program {
	return map[string]*ebpf.Program{
		"inet_sock_set_state": l.objs.EgretSetState,
		"tcp_receive_reset":   l.objs.EgretRxReset,
		"tcp_retransmit_skb":  l.objs.EgretRetransmit,
		"sock_send_length":    l.objs.EgretSendLength,
	}
}

// attachTrace attaches the tp_btf programs and pins their links, replacing
// links pinned by an earlier agent (tracing links cannot be updated in
// place; the new one is attached before the old one goes).
func (l *Loader) attachTrace() error {
	dir := filepath.Join(l.pinDir, "links", "trace")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bpfload: %w", err)
	}
	for name, prog := range l.tracePrograms() {
		lk, err := link.AttachTracing(link.TracingOptions{Program: prog})
		if err != nil {
			return &FeatureError{Feature: "tp_btf/" + name, Need: "witness events", Err: err}
		}
		path := filepath.Join(dir, name)
		if old, err := link.LoadPinnedLink(path, nil); err == nil {
			_ = old.Unpin()
			old.Close()
		}
		if err := lk.Pin(path); err != nil {
			lk.Close()
			return fmt.Errorf("bpfload: pin %s: %w", path, err)
		}
		l.trace[name] = lk
	}
	return nil
}

// Close releases this process's handles. Pinned maps and links stay, so
// redirection and witness keep working while the agent restarts.
func (l *Loader) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.aliveFD >= 0 {
		// Out of egret_alive: pods' new connects go direct.
		unix.Close(l.aliveFD)
		l.aliveFD = -1
	}
	for _, lk := range l.trace {
		lk.Close()
	}
	return l.objs.Close()
}

// Remove detaches every pod and self attachment and the tp_btf programs,
// unpins every map and removes PinDir. After Remove (and Close) nothing of
// this loader stays in the kernel.
func (l *Loader) Remove() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, kind := range []string{"pod", "self"} {
		ids, err := pinnedIDs(filepath.Join(l.pinDir, "links", kind))
		if err != nil {
			errs = append(errs, err)
		}
		for _, id := range ids {
			if err := l.unpinCgroupLinks(kind, id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for name, lk := range l.trace {
		if err := lk.Unpin(); err != nil {
			errs = append(errs, err)
		}
		lk.Close()
		delete(l.trace, name)
	}
	// Links pinned by an earlier agent that this one did not adopt.
	_ = filepath.Walk(filepath.Join(l.pinDir, "links"), func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			if err := os.Remove(p); err != nil {
				errs = append(errs, err)
			}
		}
		return nil
	})
	for _, m := range []*ebpf.Map{
		l.objs.EgretPods, l.objs.EgretGlobals, l.objs.EgretExcl, l.objs.EgretRedirSk,
		l.objs.EgretTuples, l.objs.EgretWitness, l.objs.EgretEvents,
		l.objs.EgretDirect, l.objs.EgretDirectSk, l.objs.EgretDirectStats, l.objs.EgretAlive,
		l.objs.EgretFlows, l.objs.EgretFlowSk,
	} {
		if m != nil && m.IsPinned() {
			if err := m.Unpin(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := removeDirs(l.pinDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeDirs removes root and the empty directories below it.
func removeDirs(root string) error {
	var dirs []string
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil {
			return err
		}
	}
	return nil
}

// ProgramIDs returns the kernel ids of the loaded programs (for tests that
// check nothing is left behind).
func (l *Loader) ProgramIDs() []ebpf.ProgramID {
	var ids []ebpf.ProgramID
	for _, p := range []*ebpf.Program{
		l.objs.EgretConnect4, l.objs.EgretConnect6, l.objs.EgretGetsockopt, l.objs.EgretSockops,
		l.objs.EgretSetState, l.objs.EgretRxReset, l.objs.EgretRetransmit, l.objs.EgretSendLength,
	} {
		if info, err := p.Info(); err == nil {
			if id, ok := info.ID(); ok {
				ids = append(ids, id)
			}
		}
	}
	return ids
}
