package bpfload

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/bpf"
)

// Learned-direct destinations. egret's proxy tells the loader, with
// LearnDirect, that a pod's connection to a destination turned out to be a
// protocol egret passes through (TLS, HTTP/2 with prior knowledge, a
// server-first protocol, anything not HTTP/1.x). The entry goes into
// egret_direct, an LRU hash keyed by (pod cgroup id, address, port) whose
// value carries an expiry in CLOCK_BOOTTIME. connect4/6 read it: until the
// entry expires, the pod's connects to that destination are not redirected,
// so the pod sees what the kernel says (a refused connect stays
// ECONNREFUSED) instead of a connection to egret that egret then resets.
//
// Such connections are still witnessed: connect4/6 mark the socket
// (egret_direct_sk) and sockops and tp_btf/tcp_receive_reset count, per
// pod, connects, handshakes, failures, resets and bytes in
// egret_direct_stats (DirectStats).

const (
	// DefaultLearnTTL is how long a learned-direct destination stays
	// direct when the caller gives no TTL. After it the next connect is
	// redirected and sniffed again, so a destination that started to speak
	// HTTP/1.x comes back to egret within this time.
	DefaultLearnTTL = 10 * time.Minute
	// DefaultLearnedMax is the size of egret_direct (all pods together)
	// unless Options.LearnedMax says otherwise.
	DefaultLearnedMax = 65536
)

// ErrLearningOff: LearnDirect for a pod that is not attached or whose
// PodConfig.NoLearn is set. Nothing was written.
var ErrLearningOff = errors.New("bpfload: learning is off for this pod")

// DirectProtocol is what egret's proxy sniffed on a learned-direct
// destination.
type DirectProtocol uint32

// Protocols of learned-direct destinations.
const (
	DirectOther       DirectProtocol = bpf.DirectProtoOther
	DirectTLS         DirectProtocol = bpf.DirectProtoTLS
	DirectHTTP2       DirectProtocol = bpf.DirectProtoHTTP2
	DirectServerFirst DirectProtocol = bpf.DirectProtoServerFirst
)

func (p DirectProtocol) String() string {
	switch p {
	case DirectTLS:
		return "tls"
	case DirectHTTP2:
		return "http2"
	case DirectServerFirst:
		return "server_first"
	}
	return "other"
}

// Learned is one learned-direct destination of a pod.
type Learned struct {
	Dst      netip.AddrPort
	Protocol DirectProtocol
	Learned  time.Time // when it was learned (wall clock, from CLOCK_BOOTTIME)
	Expires  time.Time
}

// DirectStats are the kernel's counters of a pod's learned-direct
// connections. They only grow while the pod is attached.
type DirectStats struct {
	Connects      uint64 // connects sent direct by a learned entry
	Established   uint64 // of those, completed handshakes
	Failed        uint64 // closed before established: refused, unreachable, timed out
	Resets        uint64 // RSTs received (a refusal included)
	Closed        uint64 // established connections that closed
	BytesAcked    uint64 // bytes sent and acknowledged by the peer, summed at close
	BytesReceived uint64 // bytes received, summed at close
}

func (s *DirectStats) add(o DirectStats) {
	s.Connects += o.Connects
	s.Established += o.Established
	s.Failed += o.Failed
	s.Resets += o.Resets
	s.Closed += o.Closed
	s.BytesAcked += o.BytesAcked
	s.BytesReceived += o.BytesReceived
}

func directStats(v bpf.EgretDirectStats) DirectStats {
	return DirectStats{Connects: v.Connects, Established: v.Established, Failed: v.Failed,
		Resets: v.Resets, Closed: v.Closed, BytesAcked: v.BytesAcked, BytesReceived: v.BytesReceived}
}

func bootNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, fmt.Errorf("bpfload: CLOCK_BOOTTIME: %w", err)
	}
	return uint64(ts.Nano()), nil
}

func directKey(podID uint64, dst netip.AddrPort) bpf.EgretDirectKey {
	return bpf.EgretDirectKey{
		CgroupId: podID,
		Addr:     addrWords(netip.AddrFrom16(dst.Addr().As16())),
		Port:     dst.Port(),
	}
}

// LearnDirect makes the pod's connects to dst go direct for ttl
// (DefaultLearnTTL if ttl <= 0). dst is the destination as the pod dialed
// it (an IPv4 address and its v4-mapped form are the same destination).
// It returns ErrLearningOff, and writes nothing, when the pod is not
// attached or has PodConfig.NoLearn. Learning again refreshes the expiry.
//
// Safe for concurrent use; it takes no lock of the Loader (a map update
// per call), so a proxy may call it from its connection goroutines.
func (l *Loader) LearnDirect(podID uint64, dst netip.AddrPort, proto DirectProtocol, ttl time.Duration) error {
	if !dst.IsValid() || dst.Port() == 0 {
		return fmt.Errorf("bpfload: learn direct: invalid destination %v", dst)
	}
	var pc bpf.EgretPodConfig
	if err := l.objs.EgretPods.Lookup(podID, &pc); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return ErrLearningOff
		}
		return fmt.Errorf("bpfload: learn direct: %w", err)
	}
	if pc.Flags&bpf.PodNoLearn != 0 {
		return ErrLearningOff
	}
	if ttl <= 0 {
		ttl = DefaultLearnTTL
	}
	now, err := bootNow()
	if err != nil {
		return err
	}
	v := bpf.EgretDirectEntry{LearnedNs: now, ExpiresNs: now + uint64(ttl), Protocol: uint32(proto)}
	if err := l.objs.EgretDirect.Put(directKey(podID, dst), &v); err != nil {
		return fmt.Errorf("bpfload: learn direct %s: %w", dst, err)
	}
	return nil
}

// ForgetDirect removes one learned-direct destination of a pod (its next
// connect is redirected again). Forgetting what is not there is no error.
func (l *Loader) ForgetDirect(podID uint64, dst netip.AddrPort) error {
	err := l.objs.EgretDirect.Delete(directKey(podID, dst))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpfload: forget direct %s: %w", dst, err)
	}
	return nil
}

// LearnedDirect returns the pod's learned-direct destinations that have
// not expired. podID 0 returns those of every pod.
func (l *Loader) LearnedDirect(podID uint64) ([]Learned, error) {
	now, err := bootNow()
	if err != nil {
		return nil, err
	}
	var out []Learned
	var k bpf.EgretDirectKey
	var v bpf.EgretDirectEntry
	it := l.objs.EgretDirect.Iterate()
	for it.Next(&k, &v) {
		if (podID != 0 && k.CgroupId != podID) || v.ExpiresNs <= now {
			continue
		}
		a := wordsAddr(k.Addr)
		out = append(out, Learned{
			Dst:      netip.AddrPortFrom(a.Unmap(), k.Port),
			Protocol: DirectProtocol(v.Protocol),
			Learned:  bootToWall(v.LearnedNs),
			Expires:  bootToWall(v.ExpiresNs),
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("bpfload: learned destinations: %w", err)
	}
	return out, nil
}

// LearnedEntries counts the entries in egret_direct, expired ones
// included (they go when a connect meets them or the LRU evicts them): what
// the map holds, never more than LearnedMax.
func (l *Loader) LearnedEntries() (int, error) {
	var k bpf.EgretDirectKey
	var v bpf.EgretDirectEntry
	n := 0
	it := l.objs.EgretDirect.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("bpfload: learned destinations: %w", err)
	}
	return n, nil
}

// LearnedMax is the number of entries egret_direct can hold.
func (l *Loader) LearnedMax() int { return int(l.objs.EgretDirect.MaxEntries()) }

// PodDirectStats returns the counters of one pod's learned-direct
// connections (zero when it had none).
func (l *Loader) PodDirectStats(podID uint64) (DirectStats, error) {
	var v bpf.EgretDirectStats
	if err := l.objs.EgretDirectStats.Lookup(podID, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return DirectStats{}, nil
		}
		return DirectStats{}, fmt.Errorf("bpfload: direct stats: %w", err)
	}
	return directStats(v), nil
}

// NodeDirectStats returns the counters of the learned-direct connections
// of every pod, including the pods this Loader has detached since it was
// loaded: within one Loader the sums never go down.
func (l *Loader) NodeDirectStats() (DirectStats, error) {
	l.directMu.Lock()
	sum := l.retiredDirect
	l.directMu.Unlock()
	var k uint64
	var v bpf.EgretDirectStats
	it := l.objs.EgretDirectStats.Iterate()
	for it.Next(&k, &v) {
		sum.add(directStats(v))
	}
	if err := it.Err(); err != nil {
		return DirectStats{}, fmt.Errorf("bpfload: direct stats: %w", err)
	}
	return sum, nil
}

// forgetPodDirect deletes the pod's learned-direct destinations and its
// counters (folded into the node-wide sums first).
func (l *Loader) forgetPodDirect(podID uint64) error {
	err := errors.Join(l.forgetLearned(podID), l.forgetPodFlows(podID))
	var st bpf.EgretDirectStats
	if serr := l.objs.EgretDirectStats.LookupAndDelete(podID, &st); serr == nil {
		l.directMu.Lock()
		l.retiredDirect.add(directStats(st))
		l.directMu.Unlock()
	} else if !errors.Is(serr, ebpf.ErrKeyNotExist) {
		err = errors.Join(err, fmt.Errorf("bpfload: direct stats: %w", serr))
	}
	return err
}

// forgetLearned deletes the pod's learned-direct destinations.
func (l *Loader) forgetLearned(podID uint64) error {
	var errs []error
	var del []bpf.EgretDirectKey
	var k bpf.EgretDirectKey
	var v bpf.EgretDirectEntry
	it := l.objs.EgretDirect.Iterate()
	for it.Next(&k, &v) {
		if k.CgroupId == podID {
			del = append(del, k)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("bpfload: learned destinations: %w", err))
	}
	for _, k := range del {
		if err := l.objs.EgretDirect.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
