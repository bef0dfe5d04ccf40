package agent

import (
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
)

// Summary is what the node is doing now, by pod and by upstream (GET
// /summary on the admin API, the node page's data, `egret top`).
type Summary struct {
	Time time.Time `json:"time"`
	// WindowSeconds is the span the rates are measured over (the samples
	// of up to the last RateWindow); 0 until two samples a second or more
	// apart were taken: every rate is then 0.
	WindowSeconds float64           `json:"window_seconds"`
	Pods          []PodSummary      `json:"pods"`
	Upstreams     []UpstreamSummary `json:"upstreams"`
	// Flows are the pairs of a pod and an upstream it sent to: which pod
	// gets which answers from which upstream.
	Flows []FlowSummary `json:"flows"`
	// Recent are the latest ambiguous and not-sent requests still held
	// for explain, newest first (at most RecentLimit).
	Recent []RecentRequest `json:"recent"`
	// Direct are the connects the kernel saw pods make direct (egret
	// did not proxy them), by pod and path, with how they failed.
	Direct []DirectSummary `json:"direct"`
}

// Counts are a pod's or an upstream's requests since its series began
// (the egret_proxy_workload_... counters).
type Counts struct {
	Requests  uint64 `json:"requests"`
	Retries   uint64 `json:"retries"`
	Ambiguous uint64 `json:"ambiguous"`
	NotSent   uint64 `json:"not_sent"`
	Failed    uint64 `json:"failed"`
	// RetrySuccesses: requests a retry answered with a success;
	// BudgetDenied: failed attempts not retried for want of budget.
	RetrySuccesses uint64 `json:"retry_successes"`
	BudgetDenied   uint64 `json:"budget_denied"`
}

// Rates are Counts' growth per second over the summary's window.
type Rates struct {
	Requests  float64 `json:"requests"`
	Retries   float64 `json:"retries"`
	Ambiguous float64 `json:"ambiguous"`
	NotSent   float64 `json:"not_sent"`
	Failed    float64 `json:"failed"`
}

// PodSummary is one pod's row.
type PodSummary struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Workload  string `json:"workload"` // kind/name; "" when unknown
	State     string `json:"state"`    // running, failed; "" for a pod gone that still has series
	Counts    Counts `json:"counts"`
	Rates     Rates  `json:"rates"`
}

// UpstreamSummary is one upstream's row, all pods together.
type UpstreamSummary struct {
	Upstream string `json:"upstream"`
	Counts   Counts `json:"counts"`
	Rates    Rates  `json:"rates"`
	// BudgetTokens: the retries its node-wide budget allows now; null
	// when it has none in use (idle past its TTL, or "other").
	BudgetTokens *float64 `json:"budget_tokens"`
}

// FlowSummary is one pod's row for one upstream.
type FlowSummary struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Upstream  string `json:"upstream"`
	Counts    Counts `json:"counts"`
	Rates     Rates  `json:"rates"`
}

// RecentRequest is an ambiguous or not-sent request: enough to find it
// (explain ID) and to see why at a glance. No URL: the page showing it
// may be reachable by more people than the admin socket.
type RecentRequest struct {
	ID       string    `json:"id"`
	Pod      string    `json:"pod"` // namespace/name; "" for a lone proxy
	Upstream string    `json:"upstream"`
	Method   string    `json:"method"`
	Outcome  string    `json:"outcome"`
	Reason   string    `json:"reason"` // the last decision's reason
	Time     time.Time `json:"time"`
}

// Bounds of the summary.
const (
	// RecentLimit is how many recent ambiguous and not-sent requests a
	// summary lists.
	RecentLimit = 50
	// RateWindow is the longest span rates are measured over.
	RateWindow = 10 * time.Second
	// rateStep is the least time between two samples.
	rateStep = time.Second
)

// SummarySource is what a Summarizer reads: *Agent and *Standalone.
type SummarySource interface {
	// SummaryParts is the node's pods (counts and rates left zero), its
	// per-workload counters, its budgets and its recent ambiguous and
	// not-sent requests, newest first.
	SummaryParts() SummaryParts
}

// SummaryParts are a SummarySource's raw figures.
type SummaryParts struct {
	Pods    []PodSummary
	Counts  []proxy.WorkloadCounts
	Budgets []UpstreamStatus
	Recent  []RecentRequest
	Direct  []DirectSummary
}

// Summarizer makes Summaries of a source, keeping the samples its rates
// are measured from. Safe for concurrent use.
type Summarizer struct {
	src SummarySource

	mu      sync.Mutex
	samples []rateSample
}

type rateSample struct {
	at        time.Time
	pods      map[podKey]Counts
	flows     map[flowKey]Counts
	upstreams map[string]Counts
}

type podKey struct{ ns, pod string }

type flowKey struct{ ns, pod, upstream string }

// NewSummarizer returns a Summarizer of src.
func NewSummarizer(src SummarySource) *Summarizer { return &Summarizer{src: src} }

// Summary is the summary at now (the source's figures are read now; now
// places them among the samples).
func (s *Summarizer) Summary(now time.Time) Summary {
	parts := s.src.SummaryParts()
	out := Summary{Time: now, Pods: []PodSummary{}, Upstreams: []UpstreamSummary{}, Flows: []FlowSummary{}, Recent: parts.Recent}
	if out.Recent == nil {
		out.Recent = []RecentRequest{}
	}
	out.Direct = parts.Direct
	if out.Direct == nil {
		out.Direct = []DirectSummary{}
	}
	pods := map[podKey]*PodSummary{}
	for _, p := range parts.Pods {
		p := p
		pods[podKey{p.Namespace, p.Pod}] = &p
	}
	ups := map[string]*UpstreamSummary{}
	flows := map[flowKey]*FlowSummary{}
	for _, c := range parts.Counts {
		if c.Source.Pod != "" {
			k := podKey{c.Source.Namespace, c.Source.Pod}
			p := pods[k]
			if p == nil {
				p = &PodSummary{Namespace: k.ns, Pod: k.pod, Workload: c.Source.Workload}
				pods[k] = p
			}
			p.Counts.add(c)
			fk := flowKey{k.ns, k.pod, c.Upstream}
			f := flows[fk]
			if f == nil {
				f = &FlowSummary{Namespace: k.ns, Pod: k.pod, Upstream: c.Upstream}
				flows[fk] = f
			}
			f.Counts.add(c)
		}
		u := ups[c.Upstream]
		if u == nil {
			u = &UpstreamSummary{Upstream: c.Upstream}
			ups[c.Upstream] = u
		}
		u.Counts.add(c)
	}
	for _, b := range parts.Budgets {
		u := ups[b.Upstream]
		if u == nil {
			u = &UpstreamSummary{Upstream: b.Upstream}
			ups[b.Upstream] = u
		}
		t := b.Tokens
		u.BudgetTokens = &t
	}

	cur := rateSample{at: now, pods: make(map[podKey]Counts, len(pods)), upstreams: make(map[string]Counts, len(ups)),
		flows: make(map[flowKey]Counts, len(flows))}
	for k, f := range flows {
		cur.flows[k] = f.Counts
	}
	for k, p := range pods {
		cur.pods[k] = p.Counts
	}
	for k, u := range ups {
		cur.upstreams[k] = u.Counts
	}
	base := s.sample(cur)
	if base != nil {
		dt := now.Sub(base.at).Seconds()
		out.WindowSeconds = dt
		for k, p := range pods {
			p.Rates = ratesOf(p.Counts, base.pods[k], dt)
		}
		for k, u := range ups {
			u.Rates = ratesOf(u.Counts, base.upstreams[k], dt)
		}
		for k, f := range flows {
			f.Rates = ratesOf(f.Counts, base.flows[k], dt)
		}
	}
	for _, p := range pods {
		out.Pods = append(out.Pods, *p)
	}
	for _, u := range ups {
		out.Upstreams = append(out.Upstreams, *u)
	}
	sort.Slice(out.Pods, func(i, j int) bool {
		a, b := out.Pods[i], out.Pods[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Pod < b.Pod
	})
	for _, f := range flows {
		out.Flows = append(out.Flows, *f)
	}
	sort.Slice(out.Flows, func(i, j int) bool {
		a, b := out.Flows[i], out.Flows[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Pod != b.Pod {
			return a.Pod < b.Pod
		}
		return a.Upstream < b.Upstream
	})
	sort.Slice(out.Upstreams, func(i, j int) bool { return out.Upstreams[i].Upstream < out.Upstreams[j].Upstream })
	return out
}

// sample keeps cur if the last sample is rateStep old or more, forgets
// those older than RateWindow, and returns the oldest sample left that
// is at least rateStep before cur (nil: none yet).
func (s *Summarizer) sample(cur rateSample) *rateSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	cut := cur.at.Add(-RateWindow)
	kept := s.samples[:0]
	for _, x := range s.samples {
		if !x.at.Before(cut) && !x.at.After(cur.at) {
			kept = append(kept, x)
		}
	}
	s.samples = kept
	var base *rateSample
	if len(s.samples) > 0 && cur.at.Sub(s.samples[0].at) >= rateStep {
		b := s.samples[0]
		base = &b
	}
	if n := len(s.samples); n == 0 || cur.at.Sub(s.samples[n-1].at) >= rateStep {
		s.samples = append(s.samples, cur)
	}
	return base
}

func (c *Counts) add(w proxy.WorkloadCounts) {
	c.Requests += w.Requests()
	c.Retries += w.Retries
	c.Ambiguous += w.Ambiguous
	c.NotSent += w.NotSent
	c.Failed += w.Failed
	c.RetrySuccesses += w.RetrySuccesses
	c.BudgetDenied += w.BudgetDenied
}

// ratesOf is the growth from was to now over dt seconds; a counter that
// went down (its series was forgotten and began again) counts from 0.
func ratesOf(now, was Counts, dt float64) Rates {
	r := func(a, b uint64) float64 {
		if b > a {
			b = 0
		}
		return float64(a-b) / dt
	}
	return Rates{
		Requests: r(now.Requests, was.Requests), Retries: r(now.Retries, was.Retries),
		Ambiguous: r(now.Ambiguous, was.Ambiguous), NotSent: r(now.NotSent, was.NotSent), Failed: r(now.Failed, was.Failed),
	}
}

// recentOf appends to out the latest ambiguous and not-sent requests of
// traces, of pod.
func recentOf(out []RecentRequest, pod string, traces *proxy.Traces) []RecentRequest {
	for _, tr := range traces.Latest(RecentLimit, engine.OutcomeAmbiguous, engine.OutcomeNotSent) {
		reason := "none"
		if n := len(tr.Attempts); n > 0 {
			if r := tr.Attempts[n-1].Decision.Reason.String(); r != "" {
				reason = r
			}
		}
		out = append(out, RecentRequest{ID: tr.RequestID, Pod: pod, Upstream: tr.Upstream, Method: tr.Method,
			Outcome: tr.Outcome.String(), Reason: reason, Time: tr.Start})
	}
	return out
}

// newestFirst sorts rs newest first and keeps RecentLimit.
func newestFirst(rs []RecentRequest) []RecentRequest {
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Time.After(rs[j].Time) })
	if len(rs) > RecentLimit {
		rs = rs[:RecentLimit]
	}
	return rs
}

// SummaryParts implements SummarySource.
func (a *Agent) SummaryParts() SummaryParts {
	var p SummaryParts
	type podTraces struct {
		name   string
		traces *proxy.Traces
	}
	var stores []podTraces
	a.mu.Lock()
	for _, ps := range a.pods {
		p.Pods = append(p.Pods, PodSummary{Namespace: ps.pod.Namespace(), Pod: ps.pod.ShortName(),
			Workload: ps.pod.Workload, State: ps.state})
		if ps.traces != nil {
			stores = append(stores, podTraces{ps.pod.Name, ps.traces})
		}
	}
	a.mu.Unlock()
	// Read outside the agent's lock: pods' events do not wait for it.
	for _, s := range stores {
		p.Recent = recentOf(p.Recent, s.name, s.traces)
	}
	p.Recent = newestFirst(p.Recent)
	p.Counts = a.shared.Metrics.WorkloadCounts()
	p.Budgets = a.Upstreams()
	p.Direct = a.DirectSummaries()
	return p
}

// SummaryParts implements SummarySource.
func (s *Standalone) SummaryParts() SummaryParts {
	return SummaryParts{
		Recent:  newestFirst(recentOf(nil, "", s.Server.Traces())),
		Counts:  s.Server.Metrics().WorkloadCounts(),
		Budgets: s.Upstreams(),
	}
}

// handleSummary adds GET /summary to an admin API whose source can be
// summarized.
func handleSummary(mux *http.ServeMux, src AdminSource) {
	ss, ok := src.(SummarySource)
	if !ok {
		return
	}
	sum := NewSummarizer(ss)
	mux.HandleFunc("GET /summary", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, sum.Summary(time.Now()))
	})
}
