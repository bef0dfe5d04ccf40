package policy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/internal/promreg"
)

// metrics counts policy reloads. A nil *metrics records nothing.
type metrics struct {
	reloads     *prometheus.CounterVec
	lastOK      prometheus.Gauge
	lastSuccess prometheus.Gauge
}

// newMetrics creates the reload metrics and registers them with reg (nil:
// no metrics).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_policy_reloads_total",
			Help: "Policy file loads, by result: success, or failure (refused; the running policy stays).",
		}, []string{"result"}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "egret_policy_last_reload_successful",
			Help: "1 if the last attempt to load the policy file succeeded, 0 if it was refused.",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "egret_policy_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last policy load that succeeded.",
		}),
	}
	if err := promreg.Register(reg, m.reloads, m.lastOK, m.lastSuccess); err != nil {
		return nil, err
	}
	// Both series exist from the start, so a rate over them is defined.
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	return m, nil
}

func (m *metrics) success(now time.Time) {
	if m == nil {
		return
	}
	m.reloads.WithLabelValues("success").Inc()
	m.lastOK.Set(1)
	m.lastSuccess.Set(float64(now.UnixNano()) / 1e9)
}

func (m *metrics) failure() {
	if m == nil {
		return
	}
	m.reloads.WithLabelValues("failure").Inc()
	m.lastOK.Set(0)
}
