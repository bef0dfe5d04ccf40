package bpfload

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/bpf"
	"github.com/egret-proxy/egret/internal/cgroup2"
)

// DefaultExcludedPorts go direct unless PodConfig.NoDefaultExcludes: the
// server-speaks-first protocols, where a proxy waiting for the client's
// first bytes would stall (FTP 21, SSH 22, SMTP 25/465/587, POP3 110/995,
// IMAP 143/993, MySQL 3306), plus the common non-HTTP client-first
// database protocols egret cannot retry anyway (PostgreSQL 5432, Redis 6379,
// memcached 11211, MongoDB 27017).
var DefaultExcludedPorts = []uint16{21, 22, 25, 110, 143, 465, 587, 993, 995, 3306, 5432, 6379, 11211, 27017}

// PodConfig is what connect4/6 need to know about one pod.
type PodConfig struct {
	// Listen4 and Listen6 are the pod's egret listeners, inside the pod's
	// network namespace. An invalid (zero) AddrPort turns redirection of
	// that family off. IPv4 destinations dialed from dual-stack IPv6
	// sockets (::ffff:a.b.c.d) use Listen4.
	Listen4 netip.AddrPort
	Listen6 netip.AddrPort
	// ExcludePorts and ExcludePrefixes go direct.
	ExcludePorts    []uint16
	ExcludePrefixes []netip.Prefix
	// NoDefaultExcludes drops DefaultExcludedPorts.
	NoDefaultExcludes bool
	// RedirectLoopback also redirects 127.0.0.0/8, 0.0.0.0, ::1 and ::
	// (by default they go direct).
	RedirectLoopback bool
	// NoLearn turns learned-direct destinations off for the pod: connect4/6
	// ignore egret_direct for it, LearnDirect refuses with ErrLearningOff,
	// and setting it deletes what the pod had learned.
	NoLearn bool
}

// CgroupID returns the cgroup v2 id of a cgroup directory (its inode
// number), the key egret's maps use for a pod.
func CgroupID(cgroupPath string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(cgroupPath, &st); err != nil {
		return 0, fmt.Errorf("bpfload: cgroup %s: %w", cgroupPath, err)
	}
	return st.Ino, nil
}

type cgProg struct {
	prog   *ebpf.Program
	attach ebpf.AttachType
}

func (l *Loader) cgroupPrograms(kind string) map[string]cgProg {
	if kind == "pod" {
		return map[string]cgProg{
			"connect4": {l.objs.EgretConnect4, ebpf.AttachCGroupInet4Connect},
			"connect6": {l.objs.EgretConnect6, ebpf.AttachCGroupInet6Connect},
			"sockops":  {l.objs.EgretSockops, ebpf.AttachCGroupSockOps},
		}
	}
	return map[string]cgProg{
		"getsockopt": {l.objs.EgretGetsockopt, ebpf.AttachCGroupGetsockopt},
		"sockops":    {l.objs.EgretSockops, ebpf.AttachCGroupSockOps},
	}
}

// AttachPod writes the pod's config and attaches connect4, connect6 and
// sockops to its cgroup (and so to every cgroup below it), pinning the
// links. Attaching a pod that is already attached updates its config and
// switches its links to this loader's programs. It returns the cgroup id.
func (l *Loader) AttachPod(cgroupPath string, cfg PodConfig) (uint64, error) {
	id, err := CgroupID(cgroupPath)
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.setPodConfig(id, cfg); err != nil {
		return 0, err
	}
	if err := l.attachCgroup("pod", cgroupPath, id); err != nil {
		l.unpinCgroupLinks("pod", id)
		l.deletePodState(id)
		return 0, err
	}
	return id, nil
}

// SetPodConfig replaces the config of an attached pod.
func (l *Loader) SetPodConfig(cgroupPath string, cfg PodConfig) error {
	id, err := CgroupID(cgroupPath)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.setPodConfig(id, cfg)
}

// DetachPod detaches the programs from the pod's cgroup and deletes its
// config, exclusions and original-destination tuples.
func (l *Loader) DetachPod(cgroupPath string) error {
	id, err := CgroupID(cgroupPath)
	if err != nil {
		return err
	}
	return l.DetachPodID(id)
}

// DetachPodID is DetachPod for a pod whose cgroup may already be gone.
func (l *Loader) DetachPodID(id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return errors.Join(l.unpinCgroupLinks("pod", id), l.deletePodState(id))
}

// DetachPodDrained detaches the pod as DetachPodID does but leaves the
// original-destination tuples of the connections it redirected until now:
// the pod's proxy may have yet to accept some of them and ask where they
// were going. Call forget once it has (its listeners are closed and its
// Serve loops ended); forget deletes those tuples, and only those: a tuple
// a later connection wrote under the same key (the pod was attached again
// meanwhile) is left alone.
//
// Without the wait, a connection redirected a moment before the detach and
// accepted a moment after it had lost its destination and was closed.
func (l *Loader) DetachPodDrained(id uint64) (forget func() error, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	err = errors.Join(l.unpinCgroupLinks("pod", id), l.deletePodConfig(id))
	keys, vals, terr := l.podTuples(id)
	err = errors.Join(err, terr)
	forget = func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		var errs []error
		for i, k := range keys {
			var v bpf.EgretOrigDst
			if l.objs.EgretTuples.Lookup(&k, &v) != nil || v != vals[i] {
				continue
			}
			if err := l.objs.EgretTuples.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	return forget, err
}

// Pods returns the cgroup ids of the pods with pinned attachments
// (including those attached by an earlier agent).
func (l *Loader) Pods() ([]uint64, error) {
	return pinnedIDs(filepath.Join(l.pinDir, "links", "pod"))
}

// AttachSelf attaches getsockopt (SO_ORIGINAL_DST answers) and sockops
// (the witness) to egret's own cgroup: the cgroup of the process that
// creates the pods' listener sockets and the upstream sockets. Accepted
// sockets take their listener's cgroup, so this is where the proxy's
// getsockopt runs. The programs run for every socket of that cgroup and
// its descendants (getsockopt for every getsockopt call, passing through
// all but SO_ORIGINAL_DST), so give egret a cgroup of its own (EnterCgroup)
// rather than attach to a shared or the root cgroup.
//
// The links an earlier agent of this pin directory pinned for another
// cgroup of its own are removed: one agent runs per pin directory, so that
// cgroup was a dead agent's (a container restarted gets a new cgroup), and
// its links would otherwise stay, holding the dead cgroup, one set per
// restart.
func (l *Loader) AttachSelf(cgroupPath string) error {
	id, err := CgroupID(cgroupPath)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.attachCgroup("self", cgroupPath, id); err != nil {
		l.unpinCgroupLinks("self", id)
		return err
	}
	ids, err := pinnedIDs(filepath.Join(l.pinDir, "links", "self"))
	if err != nil {
		return fmt.Errorf("bpfload: earlier agents' links: %w", err)
	}
	var errs []error
	for _, old := range ids {
		if old != id {
			errs = append(errs, l.unpinCgroupLinks("self", old))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bpfload: removing an earlier agent's links: %w", err)
	}
	return nil
}

// DetachSelf undoes AttachSelf.
func (l *Loader) DetachSelf(cgroupPath string) error {
	id, err := CgroupID(cgroupPath)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unpinCgroupLinks("self", id)
}

// SelfCgroup returns the cgroup v2 directory of the calling process.
func SelfCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range splitLines(string(b)) {
		if len(line) > 3 && line[:3] == "0::" {
			return filepath.Join(cgroup2.Root(), line[3:]), nil
		}
	}
	return "", errors.New("bpfload: no cgroup v2 entry in /proc/self/cgroup")
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func (l *Loader) linkDir(kind string, id uint64) string {
	return filepath.Join(l.pinDir, "links", kind, strconv.FormatUint(id, 10))
}

// attachCgroup attaches kind's programs to the cgroup and pins the links.
//
// The order beside other programs is chosen: a bpf_link without flags
// (link.AttachCgroup tries that first), which the kernel treats as
// BPF_F_ALLOW_MULTI. A connect runs the cgroup's own programs first, then
// its parent's, up to the root (kernel/bpf/cgroup.c,
// compute_effective_progs), so a pod's connect4/6 run before any
// ancestor's program that was not attached with BPF_F_PREORDER (a flag of
// recent kernels: preorder programs run before every descendant's, the
// root's first). A CNI's socket load balancer at the root therefore sees what
// egret left (its listener), and egret sees the ClusterIP the pod dialled;
// one attached with BPF_F_PREORDER runs first and egret sees the backend
// it chose. egret does not ask for BPF_F_PREORDER itself: it would not
// move egret ahead of an ancestor's preorder program, and the order would
// then differ between kernels. On a kernel without cgroup links (before
// 5.7) link.AttachCgroup falls back to BPF_F_ALLOW_MULTI, the same order,
// and pinning the link fails, so nothing is attached there. See README.md,
// "Order beside other cgroup programs".
func (l *Loader) attachCgroup(kind, cgroupPath string, id uint64) error {
	dir := l.linkDir(kind, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bpfload: %w", err)
	}
	for name, p := range l.cgroupPrograms(kind) {
		path := filepath.Join(dir, name)
		if old, err := link.LoadPinnedLink(path, nil); err == nil {
			err = old.Update(p.prog)
			if errors.Is(err, unix.ENOLINK) {
				// Severed: pinned for an earlier cgroup that is gone.
				// A fresh link replaces it below.
				_ = old.Unpin()
				err = nil
			} else if err == nil {
				old.Close()
				continue
			}
			old.Close()
			if err != nil {
				return fmt.Errorf("bpfload: update %s: %w", path, err)
			}
		}
		lk, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: p.attach, Program: p.prog})
		if err != nil {
			return fmt.Errorf("bpfload: attach %s to %s: %w", name, cgroupPath, err)
		}
		err = lk.Pin(path)
		lk.Close()
		if err != nil {
			return fmt.Errorf("bpfload: pin %s: %w (cgroup links need bpf_link, Linux 5.7)", path, err)
		}
	}
	return nil
}

// updatePinnedCgroupLinks switches links pinned by an earlier agent to the
// programs just loaded (atomically; the cgroups are never unprotected).
//
// A link whose cgroup is gone is severed: the kernel detached it when the
// cgroup was removed, and updating it fails with ENOLINK. That is the
// normal state of a dead agent's own cgroup (a restarted container gets a
// new one) and of a pod deleted while no agent ran. Such links are unpinned
// with the rest of that cgroup's pinned state (and, for a pod, its config,
// exclusions and tuples) and reported by Stale; they never stop the load.
func (l *Loader) updatePinnedCgroupLinks() error {
	for _, kind := range []string{"pod", "self"} {
		ids, err := pinnedIDs(filepath.Join(l.pinDir, "links", kind))
		if err != nil {
			return err
		}
		for _, id := range ids {
			severed := false
			for name, p := range l.cgroupPrograms(kind) {
				path := filepath.Join(l.linkDir(kind, id), name)
				old, err := link.LoadPinnedLink(path, nil)
				if err != nil {
					continue
				}
				err = old.Update(p.prog)
				old.Close()
				if errors.Is(err, unix.ENOLINK) {
					severed = true
					continue
				}
				if err != nil {
					return fmt.Errorf("bpfload: adopt %s: %w", path, err)
				}
			}
			if !severed {
				continue
			}
			err := l.unpinCgroupLinks(kind, id)
			if kind == "pod" {
				err = errors.Join(err, l.deletePodState(id))
			}
			if err != nil {
				return fmt.Errorf("bpfload: remove the pinned state of gone cgroup %d: %w", id, err)
			}
			l.stale = append(l.stale, StaleCgroup{Kind: kind, ID: id})
		}
	}
	return nil
}

// StaleCgroup is pinned state that Load found for a cgroup that no longer
// exists, and removed.
type StaleCgroup struct {
	// Kind is "pod" (a pod's connect4/6 and sockops links, config,
	// exclusions and tuples) or "self" (an earlier agent's own cgroup:
	// getsockopt and sockops links).
	Kind string
	// ID is the gone cgroup's id.
	ID uint64
}

// Stale returns what Load removed because its cgroup was gone.
func (l *Loader) Stale() []StaleCgroup {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]StaleCgroup(nil), l.stale...)
}

func (l *Loader) unpinCgroupLinks(kind string, id uint64) error {
	dir := l.linkDir(kind, id)
	var errs []error
	for name := range l.cgroupPrograms(kind) {
		path := filepath.Join(dir, name)
		lk, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		// Detach first: a link whose cgroup is gone may be held elsewhere.
		if err := lk.Unpin(); err != nil {
			errs = append(errs, err)
		}
		lk.Close()
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func pinnedIDs(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var ids []uint64
	for _, e := range ents {
		if id, err := strconv.ParseUint(e.Name(), 10, 64); err == nil {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

func addrWords(a netip.Addr) [4]uint32 {
	b := a.As16()
	var w [4]uint32
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

func wordsAddr(w [4]uint32) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	return netip.AddrFrom16(b)
}

func (l *Loader) setPodConfig(id uint64, cfg PodConfig) error {
	var pc bpf.EgretPodConfig
	if cfg.Listen4.IsValid() {
		a := cfg.Listen4.Addr().Unmap()
		if !a.Is4() {
			return fmt.Errorf("bpfload: Listen4 %s is not IPv4", cfg.Listen4)
		}
		b := a.As4()
		pc.ListenIp4 = binary.NativeEndian.Uint32(b[:])
		pc.ListenPort4 = cfg.Listen4.Port()
		pc.Flags |= bpf.PodHasV4
	}
	if cfg.Listen6.IsValid() {
		a := cfg.Listen6.Addr()
		if !a.Is6() || a.Is4In6() {
			return fmt.Errorf("bpfload: Listen6 %s is not IPv6", cfg.Listen6)
		}
		pc.ListenIp6 = addrWords(a)
		pc.ListenPort6 = cfg.Listen6.Port()
		pc.Flags |= bpf.PodHasV6
	}
	if cfg.RedirectLoopback {
		pc.Flags |= bpf.PodRedirectLoopback
	}
	if cfg.NoLearn {
		pc.Flags |= bpf.PodNoLearn
	}
	ports := cfg.ExcludePorts
	if !cfg.NoDefaultExcludes {
		ports = append(append([]uint16(nil), ports...), DefaultExcludedPorts...)
	}
	for _, p := range ports {
		pc.ExcludedPorts[p>>6] |= 1 << (p & 63)
	}
	var keys []bpf.EgretExclKey
	for _, p := range cfg.ExcludePrefixes {
		if !p.IsValid() {
			return fmt.Errorf("bpfload: invalid excluded prefix %v", p)
		}
		keys = append(keys, exclKey(id, p))
	}
	if err := l.deleteExclusions(id); err != nil {
		return err
	}
	for _, k := range keys {
		if err := l.objs.EgretExcl.Put(k, uint8(1)); err != nil {
			return fmt.Errorf("bpfload: excluded prefix: %w", err)
		}
	}
	if err := l.objs.EgretPods.Put(id, &pc); err != nil {
		return fmt.Errorf("bpfload: pod config: %w", err)
	}
	if cfg.NoLearn {
		return l.forgetLearned(id)
	}
	return nil
}

func exclKey(id uint64, p netip.Prefix) bpf.EgretExclKey {
	p = p.Masked()
	bits := 64 + p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return bpf.EgretExclKey{
		Prefixlen: uint32(bits),
		Cgroup:    [2]uint32{uint32(id), uint32(id >> 32)},
		Addr:      addrWords(netip.AddrFrom16(p.Addr().As16())),
	}
}

func (l *Loader) deleteExclusions(id uint64) error {
	var k bpf.EgretExclKey
	var v uint8
	var del []bpf.EgretExclKey
	it := l.objs.EgretExcl.Iterate()
	for it.Next(&k, &v) {
		if uint64(k.Cgroup[0])|uint64(k.Cgroup[1])<<32 == id {
			del = append(del, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("bpfload: exclusions: %w", err)
	}
	for _, k := range del {
		if err := l.objs.EgretExcl.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

func (l *Loader) deletePodState(id uint64) error {
	errs := []error{l.deletePodConfig(id)}
	keys, _, err := l.podTuples(id)
	errs = append(errs, err)
	for _, k := range keys {
		_ = l.objs.EgretTuples.Delete(k)
	}
	return errors.Join(errs...)
}

// deletePodConfig deletes the pod's config, exclusions, learned-direct
// destinations and direct-connection counters.
func (l *Loader) deletePodConfig(id uint64) error {
	var errs []error
	if err := l.objs.EgretPods.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, err)
	}
	errs = append(errs, l.deleteExclusions(id), l.forgetPodDirect(id))
	return errors.Join(errs...)
}

// podTuples returns the original-destination tuples of the pod's
// connections.
func (l *Loader) podTuples(id uint64) (keys []bpf.EgretTupleKey, vals []bpf.EgretOrigDst, err error) {
	var k bpf.EgretTupleKey
	var v bpf.EgretOrigDst
	it := l.objs.EgretTuples.Iterate()
	for it.Next(&k, &v) {
		if v.CgroupId == id {
			keys, vals = append(keys, k), append(vals, v)
		}
	}
	return keys, vals, it.Err()
}
