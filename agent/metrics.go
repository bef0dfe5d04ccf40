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

func newMetrics(reg prometheus.Registerer, att Attacher, fds *proxy.FDs) (*metrics, error) {
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
		m.failOpen, m.fdsUsed, m.fdsCap, newDirectCollector(att)); err != nil {
		return nil, err
	}
	return m, nil
}

// SourceError counts a refused reload of the pod source (File.OnError).
func (a *Agent) SourceError(err error) {
	a.m.sourceErrs.Inc()
	a.log.Error("pod source refused", "err", err)
}

// directCollector reads, at scrape time, the kernel's counters of the
// connections pods make directly to learned-direct destinations (traffic
// egret lets go because it could not retry it), so that their failures
// stay visible.
type directCollector struct {
	att                           Attacher
	conns, resets, bytes, learned *prometheus.Desc
	errs                          *prometheus.Desc
}

func newDirectCollector(att Attacher) *directCollector {
	return &directCollector{
		att: att,
		conns: prometheus.NewDesc("egret_agent_direct_connections_total",
			"Pod connects sent direct because egret learned their destination is passed through, as the kernel saw them end: established (handshake done), failed (closed before: refused, unreachable, timed out), closed (established, then closed), all (every connect).",
			[]string{"result"}, nil),
		resets: prometheus.NewDesc("egret_agent_direct_resets_total",
			"RSTs received on pods' learned-direct connections (refusals included).", nil, nil),
		bytes: prometheus.NewDesc("egret_agent_direct_bytes_total",
			"Bytes of pods' learned-direct connections, summed when they close: sent (acknowledged by the peer) and received.",
			[]string{"direction"}, nil),
		learned: prometheus.NewDesc("egret_agent_learned_destinations",
			"Destinations the kernel's learned-direct map holds now (all pods; expired ones until met or evicted).", nil, nil),
		errs: prometheus.NewDesc("egret_agent_direct_stats_errors",
			"1 when the last scrape could not read the learned-direct counters.", nil, nil),
	}
}

func (c *directCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.conns
	ch <- c.resets
	ch <- c.bytes
	ch <- c.learned
	ch <- c.errs
}

func (c *directCollector) Collect(ch chan<- prometheus.Metric) {
	failed := 0.0
	st, err := c.att.NodeDirectStats()
	if err == nil {
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(st.Connects), "all")
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(st.Established), "established")
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(st.Failed), "failed")
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(st.Closed), "closed")
		ch <- prometheus.MustNewConstMetric(c.resets, prometheus.CounterValue, float64(st.Resets))
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(st.BytesAcked), "sent")
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(st.BytesReceived), "received")
	} else {
		failed = 1
	}
	if n, err := c.att.LearnedEntries(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.learned, prometheus.GaugeValue, float64(n))
	} else {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(c.errs, prometheus.GaugeValue, failed)
}
