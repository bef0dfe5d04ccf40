package proxy

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/promreg"
)

// Metrics are the proxy's Prometheus metrics: what only the proxy sees
// (requests as answered, passthrough, tunnels, bulkhead rejections, client
// connections). Attempts, engine decisions and witness upgrades are the
// attempt runner's, counted by the retry.Metrics in Config.RetryMetrics
// (egret_retry_...) for every user of retry.Transport. One Metrics is
// shared by all the servers of a node (one per pod). A nil *Metrics
// records nothing.
type Metrics struct {
	requests    *prometheus.CounterVec
	durations   *prometheus.HistogramVec
	passthrough *prometheus.CounterVec
	ptFailures  *prometheus.CounterVec
	learned     *prometheus.CounterVec
	lateHTTPs   prometheus.Counter
	tunnels     prometheus.Counter
	rejections  *prometheus.CounterVec
	conns       prometheus.Gauge
	// byOutcome caches requests' counters of the answered outcomes, made
	// on first use (a series appears once counted, as before): no hashing
	// of the label and lookup per request.
	byOutcome [len(answerOutcomes)]atomic.Pointer[prometheus.Counter]
	durByOutc [len(answerOutcomes)]atomic.Pointer[prometheus.Observer]
	// budgets are the node's retry budgets, read at each scrape; set by
	// the first Server made with these Metrics.
	budgets    atomic.Pointer[engine.Budgets]
	budgetDesc *prometheus.Desc
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
// registered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
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
			"Retries the node-wide budget of each upstream allows now (spec section 5); a retry needs at least 1.",
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
			Help: "Transparent connections silent past the sniff timeout whose client then sent HTTP/1.x before the destination spoke: served as HTTP, not passed through.",
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
	}
	if err := promreg.Register(reg, m.requests, m.durations, budgetCollector{m}, m.passthrough, m.ptFailures, m.learned, m.lateHTTPs, m.tunnels, m.rejections, m.conns); err != nil {
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
	now := time.Now()
	b.Sweep(now) // an upstream idle past its TTL has no series
	b.Each(func(upstream string, bud *engine.Budget) {
		ch <- prometheus.MustNewConstMetric(c.m.budgetDesc, prometheus.GaugeValue, bud.Tokens(now), upstream)
	})
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
