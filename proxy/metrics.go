package proxy

import (
	"sync/atomic"

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
	passthrough *prometheus.CounterVec
	lateHTTPs   prometheus.Counter
	tunnels     prometheus.Counter
	rejections  *prometheus.CounterVec
	conns       prometheus.Gauge
	// byOutcome caches requests' counters of the answered outcomes, made
	// on first use (a series appears once counted, as before): no hashing
	// of the label and lookup per request.
	byOutcome [len(answerOutcomes)]atomic.Pointer[prometheus.Counter]
}

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
		passthrough: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_proxy_passthrough_connections_total",
			Help: "Transparent connections passed through byte for byte, by detected protocol.",
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
	if err := promreg.Register(reg, m.requests, m.passthrough, m.lateHTTPs, m.tunnels, m.rejections, m.conns); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Metrics) request(outcome string) {
	if m == nil {
		return
	}
	for i, o := range answerOutcomes {
		if o == outcome {
			c := m.byOutcome[i].Load()
			if c == nil {
				vc := m.requests.WithLabelValues(outcome)
				c = &vc
				m.byOutcome[i].Store(c)
			}
			(*c).Inc()
			return
		}
	}
	m.requests.WithLabelValues(outcome).Inc()
}

func (m *Metrics) passedThrough(p Protocol) {
	if m != nil {
		m.passthrough.WithLabelValues(string(p)).Inc()
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
