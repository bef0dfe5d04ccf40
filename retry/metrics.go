package retry

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/internal/promreg"
)

// Metrics counts what the Transport does. Register it once with
// NewMetrics and share it between Transports.
type Metrics struct {
	attempts  *prometheus.CounterVec // by failure category ("none" for a response)
	decisions *prometheus.CounterVec // by decision and reason
	outcomes  *prometheus.CounterVec // by outcome ("response" when one is relayed)
	upgrades  prometheus.Counter
	hidden    prometheus.Counter
}

// NewMetrics creates the Transport's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_retry_attempts_total",
			Help: "Upstream attempts by how they ended (failure category, or none for a response).",
		}, []string{"category"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_retry_decisions_total",
			Help: "Engine decisions after an attempt, by decision and reason.",
		}, []string{"decision", "reason"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_retry_outcomes_total",
			Help: "Finished requests by what the caller was told.",
		}, []string{"outcome"}),
		upgrades: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "egret_retry_witness_upgrades_total",
			Help: "Attempts whose sent_no_response the kernel witness upgraded to not_sent.",
		}),
		hidden: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "egret_retry_hidden_retries_total",
			Help: "Connections net/http switched to inside one attempt (its own retry of a request on a dead pooled connection).",
		}),
	}
	if err := promreg.Register(reg, m.attempts, m.decisions, m.outcomes, m.upgrades, m.hidden); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Metrics) attempt(a *Attempt) {
	if m == nil {
		return
	}
	m.attempts.WithLabelValues(a.Failure.String()).Inc()
	m.decisions.WithLabelValues(a.Decision.Decision.String(), a.Decision.Reason.String()).Inc()
	if a.Upgraded {
		m.upgrades.Inc()
	}
	if a.HiddenRetries > 0 {
		m.hidden.Add(float64(a.HiddenRetries))
	}
}

func (m *Metrics) outcome(name string) {
	if m == nil {
		return
	}
	m.outcomes.WithLabelValues(name).Inc()
}
