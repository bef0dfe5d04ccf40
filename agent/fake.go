package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/egret-proxy/egret/agent/bpfload"
)

// Fake is an in-memory Attacher: it records attachments by cgroup path
// and redirects nothing. Tests of the reconcile loop use it without root.
type Fake struct {
	mu     sync.Mutex
	nextID uint64
	ids    map[string]uint64
	pods   map[uint64]bpfload.PodConfig
	self   map[string]bool
	learnt map[uint64]map[netip.AddrPort]bpfload.DirectProtocol
	alive  bool
	flows  []bpfload.PodFlow
	// Fail, if set, makes AttachPod of that cgroup fail.
	Fail   map[string]error
	writes int // AttachPod calls that wrote a config
}

var _ Attacher = (*Fake)(nil)

// NewFake returns an empty Fake.
func NewFake() *Fake {
	return &Fake{ids: map[string]uint64{}, pods: map[uint64]bpfload.PodConfig{}, self: map[string]bool{}, Fail: map[string]error{},
		learnt: map[uint64]map[netip.AddrPort]bpfload.DirectProtocol{}}
}

// AttachPod implements Attacher.
func (f *Fake) AttachPod(cgroupPath string, cfg bpfload.PodConfig) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.Fail[cgroupPath]; err != nil {
		return 0, err
	}
	id, ok := f.ids[cgroupPath]
	if !ok {
		f.nextID++
		id = f.nextID
		f.ids[cgroupPath] = id
	}
	f.pods[id] = cfg
	f.writes++
	return id, nil
}

// attaches counts the pod configs AttachPod wrote.
func (f *Fake) attaches() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes
}

// DetachPodID implements Attacher.
func (f *Fake) DetachPodID(id uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.pods[id]; !ok {
		return fmt.Errorf("fake: pod %d not attached", id)
	}
	delete(f.pods, id)
	delete(f.learnt, id)
	return nil
}

// DetachPodDrained implements Attacher; forget does nothing (the Fake
// keeps no destinations).
func (f *Fake) DetachPodDrained(id uint64) (forget func() error, err error) {
	return func() error { return nil }, f.DetachPodID(id)
}

// Pods implements Attacher.
func (f *Fake) Pods() ([]uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]uint64, 0, len(f.pods))
	for id := range f.pods {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

// Config returns the config attached for a cgroup path.
func (f *Fake) Config(cgroupPath string) (bpfload.PodConfig, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, ok := f.ids[cgroupPath]
	if !ok {
		return bpfload.PodConfig{}, false
	}
	c, ok := f.pods[id]
	return c, ok
}

// AttachSelf implements Attacher.
func (f *Fake) AttachSelf(cgroupPath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.self[cgroupPath] = true
	return nil
}

// DetachSelf implements Attacher.
func (f *Fake) DetachSelf(cgroupPath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.self[cgroupPath] {
		return errors.New("fake: self not attached")
	}
	delete(f.self, cgroupPath)
	return nil
}

// LearnDirect implements Attacher: it records dst for an attached pod
// without NoLearn, and refuses as the loader does otherwise.
func (f *Fake) LearnDirect(podID uint64, dst netip.AddrPort, proto bpfload.DirectProtocol, ttl time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cfg, ok := f.pods[podID]
	if !ok || cfg.NoLearn {
		return bpfload.ErrLearningOff
	}
	if f.learnt[podID] == nil {
		f.learnt[podID] = map[netip.AddrPort]bpfload.DirectProtocol{}
	}
	f.learnt[podID][dst] = proto
	return nil
}

// LearnedDirect implements Attacher: what LearnDirect recorded.
func (f *Fake) LearnedDirect(podID uint64) ([]bpfload.Learned, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []bpfload.Learned
	for dst, p := range f.learnt[podID] {
		out = append(out, bpfload.Learned{Dst: dst, Protocol: p})
	}
	return out, nil
}

// ForgetDirect implements Attacher.
func (f *Fake) ForgetDirect(podID uint64, dst netip.AddrPort) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.learnt[podID], dst)
	return nil
}

// Learned returns what LearnDirect recorded for a pod.
func (f *Fake) Learned(podID uint64) map[netip.AddrPort]bpfload.DirectProtocol {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[netip.AddrPort]bpfload.DirectProtocol{}
	for k, v := range f.learnt[podID] {
		out[k] = v
	}
	return out
}

// NodeDirectStats implements Attacher: a Fake redirects nothing, so it
// sees no direct connection.
func (f *Fake) NodeDirectStats() (bpfload.DirectStats, error) { return bpfload.DirectStats{}, nil }

// NodeFlows implements Attacher: what SetFlows gave.
func (f *Fake) NodeFlows() ([]bpfload.PodFlow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]bpfload.PodFlow(nil), f.flows...), nil
}

// SetFlows sets what NodeFlows returns (a Fake's pods make no connects).
func (f *Fake) SetFlows(flows []bpfload.PodFlow) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flows = append([]bpfload.PodFlow(nil), flows...)
}

// LearnedEntries implements Attacher.
func (f *Fake) LearnedEntries() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, m := range f.learnt {
		n += len(m)
	}
	return n, nil
}

// OriginalDstOf implements Attacher: a Fake redirects nothing, so it
// knows no connection's original destination.
func (f *Fake) OriginalDstOf(syscall.RawConn) (netip.AddrPort, error) {
	return netip.AddrPort{}, bpfload.ErrNoOriginalDst
}

// SetAlive implements Attacher.
func (f *Fake) SetAlive() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.alive = true
	return nil
}

// Alive says whether SetAlive was called.
func (f *Fake) Alive() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.alive
}
