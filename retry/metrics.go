package retry

import (
	"sync/atomic"

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

	// The children counted on every request, found once: a lookup in a
	// vector hashes its label values under a lock each time. Indexed by
	// category, by decision and reason, and by outcome (cachedOutcomes).
	byCategory [cacheSlots]atomic.Pointer[prometheus.Counter]
	byDecision [cachedDecisions * cacheSlots]atomic.Pointer[prometheus.Counter]
	byOutcome  [len(cachedOutcomes)]atomic.Pointer[prometheus.Counter]
}

// cacheSlots bounds the categories and reasons whose children are cached;
// a larger value (none today) is looked up each time.
const cacheSlots = 32

// cachedDecisions: engine.Deny, engine.Retry and engine.Ambiguous.
const cachedDecisions = 3

// cachedOutcomes are the outcome labels whose children are cached.
var cachedOutcomes = [...]string{"response", "ambiguous", "not-sent", "failed"}

// child returns the child cached in slot, looking it up in vec first.
func child(slot *atomic.Pointer[prometheus.Counter], vec *prometheus.CounterVec, lvs ...string) prometheus.Counter {
	if c := slot.Load(); c != nil {
		return *c
	}
	c := vec.WithLabelValues(lvs...)
	slot.Store(&c)
	return c
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
	if f := int(a.Failure); f < cacheSlots {
		child(&m.byCategory[f], m.attempts, a.Failure.String()).Inc()
	} else {
		m.attempts.WithLabelValues(a.Failure.String()).Inc()
	}
	if d, r := int(a.Decision.Decision), int(a.Decision.Reason); d < cachedDecisions && r < cacheSlots {
		child(&m.byDecision[d*cacheSlots+r], m.decisions, a.Decision.Decision.String(), a.Decision.Reason.String()).Inc()
	} else {
		m.decisions.WithLabelValues(a.Decision.Decision.String(), a.Decision.Reason.String()).Inc()
	}
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
	for i, o := range cachedOutcomes {
		if o == name {
			child(&m.byOutcome[i], m.outcomes, name).Inc()
			return
		}
	}
	m.outcomes.WithLabelValues(name).Inc()
}
