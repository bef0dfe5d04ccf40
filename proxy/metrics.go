package proxy

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/promreg"
	"github.com/egret-proxy/egret/retry"
)

// Metrics are the proxy's Prometheus metrics: what only the proxy sees
// (requests as answered, passthrough, tunnels, bulkhead rejections, client
// connections). Attempts, engine decisions and witness upgrades are the
// attempt runner's, counted by the retry.Metrics in Config.RetryMetrics
// (egret_retry_...) for every user of retry.Runner. One Metrics is
// shared by all the servers of a node (one per pod). A nil *Metrics
// records nothing.
type Metrics struct {
	requests    *prometheus.CounterVec
	durations   *prometheus.HistogramVec
	passthrough *prometheus.CounterVec
	ptFailures  *prometheus.CounterVec
	learned     *prometheus.CounterVec
	lateHTTPs   prometheus.Counter
	h2Conns     prometheus.Counter
	tunnels     prometheus.Counter
	rejections  *prometheus.CounterVec
	conns       prometheus.Gauge
	mismatches  prometheus.Counter
	limits      *prometheus.CounterVec
	// byOutcome caches requests' counters of the answered outcomes, made
	// on first use (a series appears once counted, as before): no hashing
	// of the label and lookup per request.
	byOutcome [len(answerOutcomes)]atomic.Pointer[prometheus.Counter]
	durByOutc [len(answerOutcomes)]atomic.Pointer[prometheus.Observer]
	// budgets are the node's retry budgets, read at each scrape; set by
	// the first Server made with these Metrics.
	budgets    atomic.Pointer[engine.Budgets]
	budgetDesc *prometheus.Desc
	// work are the per-workload series.
	work *workloads
	// flows are the outcomes of passthrough flows (passflow.go).
	flows *passFlows
}

// Buckets of egret_proxy_request_duration_seconds: from a loopback
// answer to the 15 s default overall timeout.
var durationBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 30}

// answerOutcomes are the outcome labels a request is answered with.
var answerOutcomes = [...]string{labelRelayed, labelRejected,
	engine.OutcomeNotSent.String(), engine.OutcomeFailed.String(), engine.OutcomeAmbiguous.String()}

// Outcome labels of egret_proxy_requests_total besides the spec's outcomes.
const (
	labelRelayed  = "relayed"  // a response relayed as it is
	labelRejected = "rejected" // refused by the proxy before any attempt
)

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered), the per-workload series with the default bounds.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	return NewMetricsWith(reg, WorkloadOptions{})
}

// NewMetricsWith is NewMetrics with the per-workload series bounded by o.
func NewMetricsWith(reg prometheus.Registerer, o WorkloadOptions) (*Metrics, error) {
	m := &Metrics{
		work: newWorkloads(o),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_proxy_requests_total",
			Help: "Requests answered, by outcome: relayed, rejected, not-sent, failed, ambiguous.",
		}, []string{"outcome"}),
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "egret_proxy_request_duration_seconds",
			Help:    "Time from a request's head read to its answer's last byte written (every attempt and wait included), by outcome. CONNECT tunnels and upgrades are not requests here.",
			Buckets: durationBuckets,
		}, []string{"outcome"}),
		budgetDesc: prometheus.NewDesc("egret_proxy_retry_budget_tokens",
			"Retries the node-wide budget of each upstream in use allows now (spec section 5); a retry needs at least 1. Upstreams without a label of their own in the per-workload series (past the cap) are one series, upstream=\"other\", the least of their budgets; an upstream idle past its budget's TTL has none.",
			[]string{"upstream"}, nil),
		passthrough: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_proxy_passthrough_connections_total",
			Help: "Transparent connections passed through byte for byte, by detected protocol.",
		}, []string{"protocol"}),
		ptFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_proxy_passthrough_dial_failures_total",
			Help: "Transparent connections passed through whose destination could not be dialed, by detected protocol and reason (refused, timeout, unreachable, other). The pod's connection was reset: it saw a connect succeed and then a reset, where without egret its connect would have failed.",
		}, []string{"protocol", "reason"}),
		learned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_proxy_learned_direct_total",
			Help: "Destinations learned direct after their connection was sniffed as a protocol egret passes through, by protocol: the pod's next connects to them skip egret until the entry expires.",
		}, []string{"protocol"}),
		lateHTTPs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "egret_proxy_late_http_connections_total",
			Help: "Transparent connections silent past the sniff timeout whose client then sent HTTP/1.x or the HTTP/2 preface before the destination spoke: served as HTTP, not passed through.",
		}),
		h2Conns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "egret_proxy_h2_connections_total",
			Help: "Transparent connections whose client spoke the HTTP/2 preface (h2c with prior knowledge, as gRPC does): served as HTTP/2, each stream a request forwarded with retries.",
		}),
		tunnels: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "egret_proxy_connect_tunnels_total",
			Help: "CONNECT tunnels opened in explicit mode.",
		}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_proxy_bulkhead_rejections_total",
			Help: "Attempts refused a bulkhead permit, by upstream.",
		}, []string{"upstream"}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "egret_proxy_client_connections",
			Help: "Client connections open now.",
		}),
		mismatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "egret_proxy_host_mismatches_total",
			Help: "Transparent requests whose Host named a policy entry that their original destination was not shown to be (by address, DNS or verified TLS): that entry, its credential and its budget were not used.",
		}),
		limits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_proxy_limit_refusals_total",
			Help: "Connections and requests refused because their pod was at one of its limits (connections, in_flight, spool_bytes) or the process out of the descriptors it lets pods take (descriptors).",
		}, []string{"limit"}),
	}
	for _, l := range limitLabels { // defined from the start, for rate()
		m.limits.WithLabelValues(l)
	}
	m.flows = newPassFlows(m.work)
	if err := promreg.Register(reg, m.requests, m.durations, budgetCollector{m}, m.passthrough, m.lateHTTPs, m.h2Conns, m.tunnels, m.rejections, m.conns, m.mismatches, m.ptFailures, m.learned, m.limits, m.work, m.flows); err != nil {
		return nil, err
	}
	return m, nil
}

// outcomeIndex is outcome's place in answerOutcomes, -1 if it is not one.
func outcomeIndex(outcome string) int {
	for i, o := range answerOutcomes {
		if o == outcome {
			return i
		}
	}
	return -1
}

func (m *Metrics) request(outcome string) {
	if m == nil {
		return
	}
	i := outcomeIndex(outcome)
	if i < 0 {
		m.requests.WithLabelValues(outcome).Inc()
		return
	}
	c := m.byOutcome[i].Load()
	if c == nil {
		vc := m.requests.WithLabelValues(outcome)
		c = &vc
		m.byOutcome[i].Store(c)
	}
	(*c).Inc()
}

// answered observes how long an answered request took, for the outcomes
// of egret_proxy_requests_total (others, a tunnel's, are not requests).
func (m *Metrics) answered(outcome string, d time.Duration) {
	if m == nil {
		return
	}
	i := outcomeIndex(outcome)
	if i < 0 {
		return
	}
	h := m.durByOutc[i].Load()
	if h == nil {
		o := m.durations.WithLabelValues(outcome)
		h = &o
		m.durByOutc[i].Store(h)
	}
	(*h).Observe(d.Seconds())
}

// exposeBudgets makes b the budgets the metrics read, unless some were
// given before (one Budgets per node).
func (m *Metrics) exposeBudgets(b *engine.Budgets) {
	if m != nil && b != nil {
		m.budgets.CompareAndSwap(nil, b)
	}
}

// budgetCollector reads every upstream's budget at scrape time: no cost
// on the request path, and the figure is the one a retry would see.
type budgetCollector struct{ m *Metrics }

func (c budgetCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.m.budgetDesc }

func (c budgetCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.m.budgets.Load()
	if b == nil {
		return
	}
	now := c.m.work.now()
	b.Sweep(now) // an upstream idle past its TTL has no series
	other, others := math.Inf(1), false
	b.Each(func(upstream string, bud *engine.Budget) {
		tokens := bud.Tokens(now)
		if !c.m.work.labelled(upstream) {
			other, others = min(other, tokens), true
			return
		}
		ch <- prometheus.MustNewConstMetric(c.m.budgetDesc, prometheus.GaugeValue, tokens, upstream)
	})
	if others {
		ch <- prometheus.MustNewConstMetric(c.m.budgetDesc, prometheus.GaugeValue, other, OtherUpstream)
	}
}

func (m *Metrics) passedThrough(p Protocol) {
	if m != nil {
		m.passthrough.WithLabelValues(string(p)).Inc()
	}
}

func (m *Metrics) passthroughDialFailed(p Protocol, reason string) {
	if m != nil {
		m.ptFailures.WithLabelValues(string(p), reason).Inc()
	}
}

func (m *Metrics) learnedDirect(p Protocol) {
	if m != nil {
		m.learned.WithLabelValues(string(p)).Inc()
	}
}

func (m *Metrics) lateHTTP() {
	if m != nil {
		m.lateHTTPs.Inc()
	}
}

func (m *Metrics) servedH2() {
	if m != nil {
		m.h2Conns.Inc()
	}
}

func (m *Metrics) tunnel() {
	if m != nil {
		m.tunnels.Inc()
	}
}

// BulkheadRejected counts a bulkhead rejection; wire it to Bulkheads.OnReject
// when the Bulkheads are shared.
func (m *Metrics) BulkheadRejected(upstream string) {
	if m != nil {
		m.rejections.WithLabelValues(upstream).Inc()
	}
}

func (m *Metrics) hostMismatch() {
	if m != nil {
		m.mismatches.Inc()
	}
}

func (m *Metrics) limitRefused(kind int) {
	if m == nil {
		return
	}
	m.limits.WithLabelValues(limitLabels[kind]).Inc()
}

func (m *Metrics) connOpened() {
	if m != nil {
		m.conns.Inc()
	}
}

func (m *Metrics) connClosed() {
	if m != nil {
		m.conns.Dec()
	}
}

// Source is who sends a Server's requests: the pod the node agent runs it
// for. It labels the per-workload series (source_namespace, source_pod,
// source_workload); empty fields are empty labels (`egret proxy`).
type Source struct {
	Namespace string
	Pod       string
	// Workload is the pod's owner as kind/name in kubectl's form
	// ("deployment/web", "statefulset/db"); empty when unknown.
	Workload string
}

// WorkloadOptions bound the per-workload series (egret_proxy_workload_...).
type WorkloadOptions struct {
	// UpstreamCap is how many upstreams the policy does not name get a
	// label value of their own (DefaultUpstreamCap if 0); beyond, until
	// one of them is idle past TTL, requests to a new one are counted as
	// upstream "other". Upstreams the policy names always get their own.
	UpstreamCap int
	// TTL: the series of a source and upstream that saw no request for
	// that long disappear (DefaultSeriesTTL if 0). Long enough that a
	// series does not come and go between scrapes, which would lose its
	// increments to rate().
	TTL time.Duration
	// Now is the clock (nil: time.Now); tests inject one.
	Now func() time.Time
}

// Defaults of WorkloadOptions.
const (
	DefaultUpstreamCap = 100
	DefaultSeriesTTL   = 5 * time.Minute
)

// OtherUpstream is the upstream label value of the upstreams past the cap.
const OtherUpstream = "other"

// numReasons bounds the engine's reasons counted per series.
const numReasons = int(engine.ReasonRetryAfter) + 1

// workloadOutcomes are the outcomes counted per workload and upstream.
var workloadOutcomes = [...]string{labelRelayed, engine.OutcomeNotSent.String(),
	engine.OutcomeFailed.String(), engine.OutcomeAmbiguous.String()}

type seriesKey struct{ ns, pod, workload, upstream string }

// workloadSeries are the counters of one source and upstream.
type workloadSeries struct {
	last      atomic.Int64 // unix nanoseconds of the last request
	requests  [len(workloadOutcomes)]atomic.Uint64
	attempts  atomic.Uint64
	retries   [numReasons]atomic.Uint64
	denied    [numReasons]atomic.Uint64 // decision deny, on a failure
	ambiguous [numReasons]atomic.Uint64 // decision ambiguous
	successes atomic.Uint64
}

// workloads is the collector of the per-workload series: counters held
// per (source, upstream) and read at scrape time, so that series can be
// forgotten — a pod's when it goes (Forget), anyone's idle past the TTL.
type workloads struct {
	cap int
	ttl time.Duration
	now func() time.Time

	mu sync.RWMutex
	m  map[seriesKey]*workloadSeries
	// unnamed are the upstreams not named by the policy that have a label
	// of their own: the time of their last request (unix nanoseconds).
	unnamed map[string]*atomic.Int64
	// named are the upstreams the policy names that were seen, likewise.
	named     map[string]*atomic.Int64
	nextSweep atomic.Int64

	requests, attempts, retries, denied, successes *prometheus.Desc
}

func newWorkloads(o WorkloadOptions) *workloads {
	if o.UpstreamCap <= 0 {
		o.UpstreamCap = DefaultUpstreamCap
	}
	if o.TTL <= 0 {
		o.TTL = DefaultSeriesTTL
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	src := []string{"source_namespace", "source_pod", "source_workload", "upstream"}
	with := func(l ...string) []string { return append(append([]string(nil), src...), l...) }
	return &workloads{
		cap: o.UpstreamCap, ttl: o.TTL, now: o.Now,
		m: make(map[seriesKey]*workloadSeries), unnamed: make(map[string]*atomic.Int64), named: make(map[string]*atomic.Int64),
		requests: prometheus.NewDesc("egret_proxy_workload_requests_total",
			"Requests answered after reaching the attempt runner, by source pod (namespace, pod, owning workload), upstream (the policy's name; others up to a cap, then \"other\") and outcome: relayed, not-sent, failed, ambiguous.",
			with("outcome"), nil),
		attempts: prometheus.NewDesc("egret_proxy_workload_attempts_total",
			"Dispatches of requests to the upstream (net/http's own replays included), by source pod and upstream.",
			src, nil),
		retries: prometheus.NewDesc("egret_proxy_workload_retries_total",
			"Retries the engine decided, by source pod, upstream and reason (not_sent, no_response, partial_response, status).",
			with("reason"), nil),
		denied: prometheus.NewDesc("egret_proxy_workload_retries_denied_total",
			"Failed attempts the engine did not retry, by source pod, upstream, decision (deny, or ambiguous: it may have run) and reason (budget_exhausted, max_attempts, no_response, status, ...).",
			with("decision", "reason"), nil),
		successes: prometheus.NewDesc("egret_proxy_workload_retry_successes_total",
			"Requests a retry answered with a success (status below 400), by source pod and upstream: what the retries saved.",
			src, nil),
	}
}

// upstreamLabelLocked is the label value of upstream name (named: by the
// policy) at now, taking a place under the cap if one is free. Under mu.
func (w *workloads) upstreamLabelLocked(name string, named bool, now int64) string {
	if named {
		t := w.named[name]
		if t == nil {
			t = new(atomic.Int64)
			w.named[name] = t
		}
		t.Store(now)
		return name
	}
	if t, ok := w.unnamed[name]; ok {
		t.Store(now)
		return name
	}
	if len(w.unnamed) < w.cap {
		t := new(atomic.Int64)
		t.Store(now)
		w.unnamed[name] = t
		return name
	}
	return OtherUpstream
}

// lookup finds the series of an upstream that has its label already, under
// the read lock: the common case takes no exclusive lock.
func (w *workloads) lookup(src Source, upstream string, named bool, now int64) *workloadSeries {
	w.mu.RLock()
	defer w.mu.RUnlock()
	held := w.unnamed
	if named {
		held = w.named
	}
	t, ok := held[upstream]
	if !ok {
		return nil
	}
	t.Store(now)
	s := w.m[seriesKey{src.Namespace, src.Pod, src.Workload, upstream}]
	if s != nil {
		s.last.Store(now)
	}
	return s
}

// record counts one answered request of src to upstream (named: by the
// policy): its outcome, its dispatches and, from its trace (nil: none),
// the engine's decisions.
func (w *workloads) record(src Source, upstream string, named bool, outcome string, dispatches int, tr *retry.Trace) {
	oi := -1
	for i, o := range workloadOutcomes {
		if o == outcome {
			oi = i
		}
	}
	if oi < 0 {
		return
	}
	now := w.now().UnixNano()
	s := w.lookup(src, upstream, named, now)
	if next := w.nextSweep.Load(); s == nil || now >= next {
		w.mu.Lock()
		if now >= w.nextSweep.Load() {
			w.sweepLocked(now)
			w.nextSweep.Store(now + int64(w.ttl/2))
		}
		k := seriesKey{src.Namespace, src.Pod, src.Workload, w.upstreamLabelLocked(upstream, named, now)}
		if s = w.m[k]; s == nil {
			s = &workloadSeries{}
			w.m[k] = s
		}
		s.last.Store(now)
		w.mu.Unlock()
	}
	s.requests[oi].Add(1)
	s.attempts.Add(uint64(max(dispatches, 1)))
	if tr == nil {
		return
	}
	for i := range tr.Attempts {
		a := &tr.Attempts[i]
		r := int(a.Decision.Reason)
		if r >= numReasons {
			continue
		}
		switch a.Decision.Decision {
		case engine.Retry:
			s.retries[r].Add(1)
		case engine.Ambiguous:
			s.ambiguous[r].Add(1)
		default:
			if !succeeded(a) {
				s.denied[r].Add(1)
			}
		}
	}
	if n := len(tr.Attempts); n > 1 && succeeded(&tr.Attempts[n-1]) {
		s.successes.Add(1)
	}
}

// succeeded: the attempt got a response the spec calls a success.
func succeeded(a *retry.Attempt) bool {
	return a.Failure == engine.CategoryNone && a.Status > 0 && a.Status < 400
}

// forget removes the series of a source's pod.
func (w *workloads) forget(src Source) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range w.m {
		if k.ns == src.Namespace && k.pod == src.Pod {
			delete(w.m, k)
		}
	}
}

// sweepLocked removes the series and the upstream places idle past the
// TTL at now. Under mu.
func (w *workloads) sweepLocked(now int64) {
	cut := now - int64(w.ttl)
	for k, s := range w.m {
		if s.last.Load() <= cut {
			delete(w.m, k)
		}
	}
	for _, held := range []map[string]*atomic.Int64{w.unnamed, w.named} {
		for u, t := range held {
			if t.Load() <= cut {
				delete(held, u)
			}
		}
	}
}

// labelled reports whether upstream has a label value of its own now.
func (w *workloads) labelled(upstream string) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.named[upstream] != nil || w.unnamed[upstream] != nil
}

func (w *workloads) Describe(ch chan<- *prometheus.Desc) {
	ch <- w.requests
	ch <- w.attempts
	ch <- w.retries
	ch <- w.denied
	ch <- w.successes
}

func (w *workloads) Collect(ch chan<- prometheus.Metric) {
	w.mu.Lock()
	w.sweepLocked(w.now().UnixNano())
	keys := make([]seriesKey, 0, len(w.m))
	ss := make([]*workloadSeries, 0, len(w.m))
	for k, s := range w.m {
		keys = append(keys, k)
		ss = append(ss, s)
	}
	w.mu.Unlock()
	c := func(d *prometheus.Desc, v uint64, k seriesKey, extra ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v),
			append([]string{k.ns, k.pod, k.workload, k.upstream}, extra...)...)
	}
	for i, k := range keys {
		s := ss[i]
		for o, name := range workloadOutcomes {
			if v := s.requests[o].Load(); v > 0 {
				c(w.requests, v, k, name)
			}
		}
		c(w.attempts, s.attempts.Load(), k)
		c(w.successes, s.successes.Load(), k)
		for r := range numReasons {
			reason := engine.Reason(r).String()
			if reason == "" {
				reason = reasonNone
			}
			if v := s.retries[r].Load(); v > 0 {
				c(w.retries, v, k, reason)
			}
			if v := s.denied[r].Load(); v > 0 {
				c(w.denied, v, k, engine.Deny.String(), reason)
			}
			if v := s.ambiguous[r].Load(); v > 0 {
				c(w.denied, v, k, engine.Ambiguous.String(), reason)
			}
		}
	}
}

// Workload counts one answered request in the per-workload series: from
// src to upstream (named: the policy names it), with its outcome (relayed,
// not-sent, failed, ambiguous), its dispatches and its trace (nil: none).
func (m *Metrics) Workload(src Source, upstream string, named bool, outcome string, dispatches int, tr *retry.Trace) {
	if m != nil {
		m.work.record(src, upstream, named, outcome, dispatches, tr)
	}
}

// Forget removes every per-workload and passthrough flow series of src's
// pod (the agent calls it when the pod goes).
func (m *Metrics) Forget(src Source) {
	if m != nil {
		m.work.forget(src)
		m.flows.forget(src)
	}
}
