package agent

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/proxy"
)

// What egret does not proxy it still observes: the kernel counts, per pod
// and path, what became of the connects egret left direct (direct by
// policy, learned direct, fail-open; bpfload.PodFlows). The agent names
// the pods and shows them in the summary (egret top, the node page) and
// as metrics.

// DirectSummary is one pod's connections egret does not retry on one
// path, as they ended, with the evidence class each failure would have had
// had egret proxied it: connects left direct, as the kernel saw them, and
// (path passthrough) connections egret passed through byte for byte, as
// egret's own upstream socket saw them, by protocol and destination.
type DirectSummary struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Path      string `json:"path"` // direct_port, direct_cidr, learned_direct, fail_open, passthrough
	// Protocol (tls, http2, server_first, ...) and Destination (a policy
	// entry, a Service, or "other") of a passthrough row.
	Protocol       string `json:"protocol,omitempty"`
	Destination    string `json:"destination,omitempty"`
	Connects       uint64 `json:"connects"`
	Established    uint64 `json:"established"`
	Refused        uint64 `json:"refused"`
	TimedOut       uint64 `json:"timed_out"`
	Unreachable    uint64 `json:"unreachable"`
	ResetBeforeAck uint64 `json:"reset_before_ack"`
	ResetAfterAck  uint64 `json:"reset_after_ack"`
	// DialFailed: a passthrough dial that failed otherwise.
	DialFailed uint64 `json:"dial_failed,omitempty"`
	// Retransmits: segments retransmitted (SYNs included); for
	// passthrough, by egret's upstream sockets, counted as they close.
	Retransmits uint64 `json:"retransmits"`
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
		SafeToRetry: s.SafeToRetry(), Ambiguous: s.Ambiguous()}
}

// PathPassthrough is the path of the connections egret passed through.
const PathPassthrough = "passthrough"

func passthroughSummary(c proxy.PassthroughCounts) DirectSummary {
	return DirectSummary{Namespace: c.Source.Namespace, Pod: c.Source.Pod, Path: PathPassthrough,
		Protocol: string(c.Protocol), Destination: c.Destination, Connects: c.Connects,
		Established: c.Established, Refused: c.Refused, TimedOut: c.TimedOut, Unreachable: c.Unreachable,
		ResetBeforeAck: c.ResetBeforeAck, ResetAfterAck: c.ResetAfterAck, DialFailed: c.DialFailed,
		Retransmits: c.Retransmits, SafeToRetry: c.SafeToRetry(), Ambiguous: c.Ambiguous()}
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

// DirectSummaries returns the connections of the node's pods that egret
// does not retry: direct ones by pod and path (none when the kernel's
// counters cannot be read), then those its pods' proxies passed through,
// by pod, protocol and destination.
func (a *Agent) DirectSummaries() []DirectSummary {
	out, err := a.directRows()
	if err != nil {
		a.log.Warn("direct flow counters", "err", err)
	}
	return out
}

// directRows is DirectSummaries, with the error of reading the kernel's
// counters.
func (a *Agent) directRows() ([]DirectSummary, error) {
	var out []DirectSummary
	flows, err := a.directFlows()
	for _, f := range flows {
		out = append(out, directSummary(f.ns, f.pod, f.path, f.stats))
	}
	for _, c := range a.shared.Metrics.PassthroughCounts() {
		out = append(out, passthroughSummary(c))
	}
	return out, err
}

// directTotals sums rows for egret status.
func directTotals(rows []DirectSummary) *DirectTotals {
	var t DirectTotals
	for _, d := range rows {
		t.Connects += d.Connects
		t.SafeToRetry += d.SafeToRetry
		t.Ambiguous += d.Ambiguous
	}
	return &t
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
