package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/internal/promreg"
	"github.com/egret-proxy/egret/proxy"
)

// metrics are the agent's own; the proxy's are registered beside them.
type metrics struct {
	pods       *prometheus.GaugeVec
	events     *prometheus.CounterVec
	failures   *prometheus.CounterVec
	startTime  prometheus.Histogram
	collected  prometheus.Counter
	sourceErrs prometheus.Counter
	failOpen   prometheus.Gauge
	fdsUsed    prometheus.GaugeFunc
	fdsCap     prometheus.GaugeFunc
}

func newMetrics(reg prometheus.Registerer, fds *proxy.FDs) (*metrics, error) {
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
		failOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "egret_agent_descriptors_exhausted",
			Help: "1 while egret is out of the file descriptors it lets pods take: every pod's new connects go direct (fail open) until it has room again.",
		}),
		fdsUsed: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "egret_agent_pod_descriptors",
			Help: "File descriptors held for pods' connections now (two per connection: the client's and its upstream's).",
		}, func() float64 { return float64(fds.Used()) }),
		fdsCap: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "egret_agent_pod_descriptors_capacity",
			Help: "File descriptors pods' connections may hold: the soft RLIMIT_NOFILE less the reserve egret keeps for itself.",
		}, func() float64 { return float64(fds.Capacity()) }),
	}
	if err := promreg.Register(reg, m.pods, m.events, m.failures, m.startTime, m.collected, m.sourceErrs,
		m.failOpen, m.fdsUsed, m.fdsCap); err != nil {
		return nil, err
	}
	return m, nil
}

// SourceError counts a refused reload of the pod source (File.OnError).
func (a *Agent) SourceError(err error) {
	a.m.sourceErrs.Inc()
	a.log.Error("pod source refused", "err", err)
}
