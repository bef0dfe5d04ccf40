package agent

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/agent/bpfload"
)

// What egret does not proxy it still observes: the kernel counts, per pod
// and path, what became of the connects egret left direct (direct by
// policy, learned direct, fail-open; bpfload.PodFlows). The agent names
// the pods and shows them in the summary (egret top, the node page) and
// as metrics.

// DirectSummary is one pod's direct connections on one path, as the
// kernel saw them end, with the evidence class each failure would have
// had had egret proxied it.
type DirectSummary struct {
	Namespace      string `json:"namespace"`
	Pod            string `json:"pod"`
	Path           string `json:"path"` // direct_port, direct_cidr, learned_direct, fail_open
	Connects       uint64 `json:"connects"`
	Established    uint64 `json:"established"`
	Refused        uint64 `json:"refused"`
	TimedOut       uint64 `json:"timed_out"`
	Unreachable    uint64 `json:"unreachable"`
	ResetBeforeAck uint64 `json:"reset_before_ack"`
	ResetAfterAck  uint64 `json:"reset_after_ack"`
	Retransmits    uint64 `json:"retransmits"`
	// SafeToRetry: failures whose evidence would have been not_sent (a
	// retry could have fixed them safely, whatever the method);
	// Ambiguous: sent_no_response (safe only for idempotent requests).
	SafeToRetry uint64 `json:"safe_to_retry"`
	Ambiguous   uint64 `json:"ambiguous"`
}

func directSummary(ns, pod string, path bpfload.FlowPath, s bpfload.FlowStats) DirectSummary {
	return DirectSummary{Namespace: ns, Pod: pod, Path: path.String(), Connects: s.Connects,
		Established: s.Established, Refused: s.Refused, TimedOut: s.TimedOut, Unreachable: s.Unreachable,
		ResetBeforeAck: s.ResetBeforeAck, ResetAfterAck: s.ResetAfterAck, Retransmits: s.Retransmits,
		SafeToRetry: s.SafeToRetry(), Ambiguous: s.ResetAfterAck}
}

// DirectTotals sums DirectSummary over the node's pods (egret status).
type DirectTotals struct {
	Connects    uint64 `json:"connects"`
	SafeToRetry uint64 `json:"safe_to_retry"`
	Ambiguous   uint64 `json:"ambiguous"`
}

type namedFlow struct {
	ns, pod string
	path    bpfload.FlowPath
	stats   bpfload.FlowStats
}

// directFlows reads the kernel's counters and names their pods. Entries
// of pods the agent does not know now (detached, or retired sums) are
// left out: a pod's series end with the pod.
func (a *Agent) directFlows() ([]namedFlow, error) {
	flows, err := a.cfg.Attacher.NodeFlows()
	if err != nil {
		return nil, err
	}
	names := map[uint64][2]string{}
	a.mu.Lock()
	for _, ps := range a.pods {
		if ps.cgid != 0 {
			names[ps.cgid] = [2]string{ps.pod.Namespace(), ps.pod.ShortName()}
		}
	}
	a.mu.Unlock()
	var out []namedFlow
	for _, f := range flows {
		n, ok := names[f.PodID]
		if !ok || f.PodID == 0 {
			continue
		}
		out = append(out, namedFlow{n[0], n[1], f.Path, f.Stats})
	}
	sort.Slice(out, func(i, j int) bool {
		x, y := out[i], out[j]
		if x.ns != y.ns {
			return x.ns < y.ns
		}
		if x.pod != y.pod {
			return x.pod < y.pod
		}
		return x.path < y.path
	})
	return out, nil
}

// DirectSummaries returns the direct connections of the node's pods, by
// pod and path (nil when the kernel's counters cannot be read).
func (a *Agent) DirectSummaries() []DirectSummary {
	flows, err := a.directFlows()
	if err != nil {
		a.log.Warn("direct flow counters", "err", err)
		return nil
	}
	out := make([]DirectSummary, 0, len(flows))
	for _, f := range flows {
		out = append(out, directSummary(f.ns, f.pod, f.path, f.stats))
	}
	return out
}

// flowCollector exports the kernel's direct-connection counters at scrape
// time. Series are per pod, path (4) and outcome (8): bounded by the pods
// on the node, never by destinations.
type flowCollector struct {
	a                            *Agent
	outcomes, retrans, segs, err *prometheus.Desc
}

func newFlowCollector(a *Agent) *flowCollector {
	return &flowCollector{
		a: a,
		outcomes: prometheus.NewDesc("egret_agent_direct_flows_total",
			"Pod connects egret left direct (path: direct_port, direct_cidr, learned_direct, fail_open), as the kernel saw them: connects (SYN sent), established, and how the failed ones ended, each with the evidence class it would have had through egret (not_sent: a retry was safe; sent_no_response: ambiguous for non-idempotent requests).",
			[]string{"namespace", "pod", "path", "outcome", "evidence"}, nil),
		retrans: prometheus.NewDesc("egret_agent_direct_retransmits_total",
			"Retransmitted segments (SYNs included) of pods' direct connections.",
			[]string{"namespace", "pod", "path"}, nil),
		segs: prometheus.NewDesc("egret_agent_direct_segments_total",
			"Data segments sent by pods' direct connections, summed when they close (retransmission rate: retransmits / segments).",
			[]string{"namespace", "pod", "path"}, nil),
		err: prometheus.NewDesc("egret_agent_direct_flows_errors",
			"1 when the last scrape could not read the kernel's direct-flow counters.", nil, nil),
	}
}

func (c *flowCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.outcomes
	ch <- c.retrans
	ch <- c.segs
	ch <- c.err
}

func (c *flowCollector) Collect(ch chan<- prometheus.Metric) {
	flows, err := c.a.directFlows()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.err, prometheus.GaugeValue, 1)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.err, prometheus.GaugeValue, 0)
	for _, f := range flows {
		p := f.path.String()
		ctr := func(v uint64, outcome, evidence string) {
			ch <- prometheus.MustNewConstMetric(c.outcomes, prometheus.CounterValue, float64(v), f.ns, f.pod, p, outcome, evidence)
		}
		ctr(f.stats.Connects, "connects", "")
		ctr(f.stats.Established, "established", "")
		ctr(f.stats.Abandoned, "abandoned", "")
		for _, x := range f.stats.Failures() {
			ctr(x.Count, x.Outcome, x.Evidence)
		}
		ch <- prometheus.MustNewConstMetric(c.retrans, prometheus.CounterValue, float64(f.stats.Retransmits), f.ns, f.pod, p)
		ch <- prometheus.MustNewConstMetric(c.segs, prometheus.CounterValue, float64(f.stats.SegsOut), f.ns, f.pod, p)
	}
}
