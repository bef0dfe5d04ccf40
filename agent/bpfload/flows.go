package bpfload

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/egret-proxy/egret/bpf"
)

// Flow outcomes of the connections egret does not proxy. connect4/6 put a
// flow_sock on every pod socket they leave direct, naming why (FlowPath);
// the tp_btf programs (inet_sock_set_state, tcp_receive_reset,
// tcp_retransmit_skb) count what becomes of it in egret_flows, a per-CPU
// hash keyed by (pod cgroup id, path). Nothing is sent to user space per
// connection: the agent sums the CPUs when it reads (PodFlows, NodeFlows).

// FlowPath is why connect4/6 left a pod's connect direct.
type FlowPath uint32

// Paths of direct connections.
const (
	PathPolicyPort FlowPath = bpf.PathPolicyPort // the port is excluded
	PathPolicyCIDR FlowPath = bpf.PathPolicyCIDR // the address is in an excluded prefix
	PathLearned    FlowPath = bpf.PathLearned    // learned direct (LearnDirect)
	PathFailOpen   FlowPath = bpf.PathFailOpen   // no agent or no listener in the pod's netns
)

// FlowPaths lists every path, in a stable order.
var FlowPaths = []FlowPath{PathPolicyPort, PathPolicyCIDR, PathLearned, PathFailOpen}

func (p FlowPath) String() string {
	switch p {
	case PathPolicyPort:
		return "direct_port"
	case PathPolicyCIDR:
		return "direct_cidr"
	case PathLearned:
		return "learned_direct"
	case PathFailOpen:
		return "fail_open"
	}
	return fmt.Sprintf("path_%d", uint32(p))
}

// FlowStats is what the kernel saw of one pod's direct connections on one
// path. Counters only grow while the pod is attached. A connection ends in
// at most one of Refused, TimedOut, Unreachable, Abandoned, ResetBeforeAck
// and ResetAfterAck.
type FlowStats struct {
	Connects       uint64 // SYNs sent
	Established    uint64 // handshakes completed
	Refused        uint64 // ECONNREFUSED in SYN_SENT (RST, ICMP port unreachable)
	TimedOut       uint64 // ETIMEDOUT in SYN_SENT: SYN retries exhausted
	Unreachable    uint64 // EHOSTUNREACH / ENETUNREACH in SYN_SENT
	Abandoned      uint64 // closed in SYN_SENT by the pod, no error
	ResetBeforeAck uint64 // reset after the handshake, none of the pod's bytes acked (which proves nothing: see Failures)
	ResetAfterAck  uint64 // reset after some of the pod's bytes were acked
	Retransmits    uint64 // retransmitted segments, SYNs included
	SegsOut        uint64 // data segments sent by established connections, summed at close
}

// Evidence classes a failure would have had, had egret proxied it (the
// retry package's names).
const (
	EvidenceNotSent        = "not_sent"         // nothing reached the peer's application: safe to retry
	EvidenceSentNoResponse = "sent_no_response" // bytes were delivered: ambiguous unless idempotent
)

// FlowFailure is one failure class with the evidence class it carries.
type FlowFailure struct {
	Outcome  string // refused, timed_out, unreachable, reset_before_ack, reset_after_ack
	Evidence string // EvidenceNotSent or EvidenceSentNoResponse
	Count    uint64
}

// Failures returns the failure classes of s (abandoned connects are not
// failures: the pod gave up) with their evidence classes. A reset before
// any of the pod's bytes was acked is sent_no_response, not not_sent: a
// peer that read a request and reset the connection before its delayed
// ACK left the count of acked bytes where it was (measured: 208 bytes
// acked before and after a request the server read), and the kernel
// does not process the ACK a reset carries. Only a connect that never
// completed proves that nothing was delivered.
func (s FlowStats) Failures() []FlowFailure {
	return []FlowFailure{
		{"refused", EvidenceNotSent, s.Refused},
		{"timed_out", EvidenceNotSent, s.TimedOut},
		{"unreachable", EvidenceNotSent, s.Unreachable},
		{"reset_before_ack", EvidenceSentNoResponse, s.ResetBeforeAck},
		{"reset_after_ack", EvidenceSentNoResponse, s.ResetAfterAck},
	}
}

// SafeToRetry is the number of failures a retry could have fixed safely
// (evidence not_sent), whatever the request's method.
func (s FlowStats) SafeToRetry() uint64 {
	return s.Refused + s.TimedOut + s.Unreachable
}

// Ambiguous is the number of failures whose evidence is sent_no_response:
// a retry was safe only for an idempotent request.
func (s FlowStats) Ambiguous() uint64 {
	return s.ResetBeforeAck + s.ResetAfterAck
}

// Add adds o to s.
func (s *FlowStats) Add(o FlowStats) {
	s.Connects += o.Connects
	s.Established += o.Established
	s.Refused += o.Refused
	s.TimedOut += o.TimedOut
	s.Unreachable += o.Unreachable
	s.Abandoned += o.Abandoned
	s.ResetBeforeAck += o.ResetBeforeAck
	s.ResetAfterAck += o.ResetAfterAck
	s.Retransmits += o.Retransmits
	s.SegsOut += o.SegsOut
}

func sumFlows(per []bpf.EgretFlowStats) FlowStats {
	var s FlowStats
	for _, v := range per {
		s.Add(FlowStats{Connects: v.Connects, Established: v.Established, Refused: v.Refused,
			TimedOut: v.TimedOut, Unreachable: v.Unreachable, Abandoned: v.Abandoned,
			ResetBeforeAck: v.ResetBeforeAck, ResetAfterAck: v.ResetAfterAck,
			Retransmits: v.Retransmits, SegsOut: v.SegsOut})
	}
	return s
}

// PodFlows returns one pod's direct-connection outcomes by path (paths it
// never used are absent).
func (l *Loader) PodFlows(podID uint64) (map[FlowPath]FlowStats, error) {
	out := map[FlowPath]FlowStats{}
	for _, p := range FlowPaths {
		var per []bpf.EgretFlowStats
		err := l.objs.EgretFlows.Lookup(bpf.EgretFlowKey{CgroupId: podID, Path: uint32(p)}, &per)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("bpfload: flows: %w", err)
		}
		out[p] = sumFlows(per)
	}
	return out, nil
}

// PodFlow is one entry of NodeFlows.
type PodFlow struct {
	PodID uint64
	Path  FlowPath
	Stats FlowStats
}

// NodeFlows returns the direct-connection outcomes of every attached pod,
// one entry per pod and path it used. Pods detached by this Loader are
// summed under PodID 0 (their counters leave the map at detach), so within
// one Loader the node's sums never go down.
func (l *Loader) NodeFlows() ([]PodFlow, error) {
	var out []PodFlow
	l.directMu.Lock()
	for p, s := range l.retiredFlows {
		out = append(out, PodFlow{Path: p, Stats: s})
	}
	l.directMu.Unlock()
	var k bpf.EgretFlowKey
	var per []bpf.EgretFlowStats
	it := l.objs.EgretFlows.Iterate()
	for it.Next(&k, &per) {
		out = append(out, PodFlow{PodID: k.CgroupId, Path: FlowPath(k.Path), Stats: sumFlows(per)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("bpfload: flows: %w", err)
	}
	return out, nil
}

// FlowEntries is the number of entries in egret_flows: one per pod and
// path used (at most 4096 pods times len(FlowPaths)).
func (l *Loader) FlowEntries() (int, error) {
	var k bpf.EgretFlowKey
	var per []bpf.EgretFlowStats
	n := 0
	it := l.objs.EgretFlows.Iterate()
	for it.Next(&k, &per) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("bpfload: flows: %w", err)
	}
	return n, nil
}

// forgetPodFlows deletes the pod's entries in egret_flows, folding them
// into the retired sums first.
func (l *Loader) forgetPodFlows(podID uint64) error {
	var errs []error
	for _, p := range FlowPaths {
		var per []bpf.EgretFlowStats
		err := l.objs.EgretFlows.LookupAndDelete(bpf.EgretFlowKey{CgroupId: podID, Path: uint32(p)}, &per)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("bpfload: flows: %w", err))
			continue
		}
		s := sumFlows(per)
		l.directMu.Lock()
		if l.retiredFlows == nil {
			l.retiredFlows = map[FlowPath]FlowStats{}
		}
		r := l.retiredFlows[p]
		r.Add(s)
		l.retiredFlows[p] = r
		l.directMu.Unlock()
	}
	return errors.Join(errs...)
}
