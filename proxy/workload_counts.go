package proxy

import (
	"cmp"
	"slices"
	"strings"

	"github.com/egret-proxy/egret/engine"
)

// WorkloadCounts are the per-workload counters of one source and
// upstream as they stand now: what the egret_proxy_workload_... series
// say, for the admin API's summary and the node page.
type WorkloadCounts struct {
	Source   Source
	Upstream string // the series' label: a name, or OtherUpstream
	// Requests by outcome: relayed, not-sent, failed, ambiguous.
	Relayed, NotSent, Failed, Ambiguous uint64
	Attempts                            uint64
	// Retries the engine decided; Denied the failed attempts it did not
	// retry (deny), BudgetDenied those of them for want of budget.
	Retries, Denied, BudgetDenied uint64
	RetrySuccesses                uint64
}

// Requests is every request counted.
func (c WorkloadCounts) Requests() uint64 { return c.Relayed + c.NotSent + c.Failed + c.Ambiguous }

// WorkloadCounts returns the counters of every per-workload series held
// now (those idle past the TTL are gone), by namespace, pod and
// upstream.
func (m *Metrics) WorkloadCounts() []WorkloadCounts {
	if m == nil {
		return nil
	}
	w := m.work
	w.mu.Lock()
	w.sweepLocked(w.now().UnixNano())
	out := make([]WorkloadCounts, 0, len(w.m))
	for k, s := range w.m {
		c := WorkloadCounts{
			Source:   Source{Namespace: k.ns, Pod: k.pod, Workload: k.workload},
			Upstream: k.upstream,
			Attempts: s.attempts.Load(), RetrySuccesses: s.successes.Load(),
		}
		for i, o := range workloadOutcomes {
			v := s.requests[i].Load()
			switch o {
			case labelRelayed:
				c.Relayed = v
			case engine.OutcomeNotSent.String():
				c.NotSent = v
			case engine.OutcomeFailed.String():
				c.Failed = v
			case engine.OutcomeAmbiguous.String():
				c.Ambiguous = v
			}
		}
		for r := range numReasons {
			c.Retries += s.retries[r].Load()
			c.Denied += s.denied[r].Load()
		}
		c.BudgetDenied = s.denied[engine.ReasonBudgetExhausted].Load()
		out = append(out, c)
	}
	w.mu.Unlock()
	slices.SortFunc(out, func(a, b WorkloadCounts) int {
		return cmp.Or(a.Source.cmpPod(b.Source), strings.Compare(a.Upstream, b.Upstream))
	})
	return out
}

// cmpPod orders sources by namespace, then pod.
func (s Source) cmpPod(o Source) int {
	return cmp.Or(strings.Compare(s.Namespace, o.Namespace), strings.Compare(s.Pod, o.Pod))
}

// Metrics returns the metrics the server counts in (nil: none).
func (s *Server) Metrics() *Metrics { return s.cfg.Metrics }
