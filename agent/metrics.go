package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/internal/promreg"
)

// metrics are the agent's own; the proxy's are registered beside them.
type metrics struct {
	pods       *prometheus.GaugeVec
	events     *prometheus.CounterVec
	failures   *prometheus.CounterVec
	startTime  prometheus.Histogram
	collected  prometheus.Counter
	sourceErrs prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "egret_agent_pods",
			Help: "Pods known to the agent, by state (running, failed).",
		}, []string{"state"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_agent_pod_events_total",
			Help: "Pod source events handled, by kind.",
		}, []string{"kind"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egret_agent_pod_failures_total",
			Help: "Failed pod starts and stops, by step.",
		}, []string{"step"}),
		startTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "egret_agent_pod_start_seconds",
			Help:    "Time to put a pod behind egret (listeners, attach, proxy).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		collected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "egret_agent_stale_pods_removed_total",
			Help: "Pinned pod attachments left by an earlier agent for pods the source no longer has.",
		}),
		sourceErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "egret_agent_pod_source_errors_total",
			Help: "Refused reloads of the pod source.",
		}),
	}
	if err := promreg.Register(reg, m.pods, m.events, m.failures, m.startTime, m.collected, m.sourceErrs); err != nil {
		return nil, err
	}
	return m, nil
}

// SourceError counts a refused reload of the pod source (File.OnError).
func (a *Agent) SourceError(err error) {
	a.m.sourceErrs.Inc()
	a.log.Error("pod source refused", "err", err)
}
