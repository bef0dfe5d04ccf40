package agent

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/internal/testkit/promtest"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/proxytest"
)

// The kernel's direct-flow counters come out named by pod, in the summary
// and as metrics whose series are per pod, path and outcome; a pod the
// agent does not run (detached, retired sums) has none.
func TestDirectFlowsNamedAndBounded(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	fake := NewFake()
	src, _ := pods.NewMemory(pods.Pod{Name: "shop/web", Cgroup: "/cg/web", ListenPort: freePort(t)})
	a, err := New(Config{Attacher: fake, Source: src, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "running", func() bool { st, err := a.Pod("shop/web"); return err == nil && st.State == StateRunning })
	st, _ := a.Pod("shop/web")

	stats := bpfload.FlowStats{Connects: 50, Established: 40, Refused: 3, TimedOut: 2, Unreachable: 1,
		ResetBeforeAck: 4, ResetAfterAck: 5, Retransmits: 7, SegsOut: 700}
	var flows []bpfload.PodFlow
	for _, p := range bpfload.FlowPaths {
		flows = append(flows, bpfload.PodFlow{PodID: st.CgroupID, Path: p, Stats: stats})
	}
	flows = append(flows, bpfload.PodFlow{PodID: 0, Path: bpfload.PathLearned, Stats: stats},
		bpfload.PodFlow{PodID: st.CgroupID + 1000, Path: bpfload.PathLearned, Stats: stats})
	fake.SetFlows(flows)

	if d := a.Status().Direct; d == nil || d.Connects != 200 || d.SafeToRetry != 24 || d.Ambiguous != 36 {
		t.Errorf("status direct = %+v", d)
	}
	sum := NewSummarizer(a).Summary(time.Now())
	if len(sum.Direct) != len(bpfload.FlowPaths) {
		t.Fatalf("direct rows = %+v", sum.Direct)
	}
	for _, d := range sum.Direct {
		if d.Namespace != "shop" || d.Pod != "web" || d.SafeToRetry != 6 || d.Ambiguous != 9 || d.Connects != 50 {
			t.Errorf("direct row %+v", d)
		}
	}
	if got := promtest.CounterSum(t, reg, "egret_agent_direct_flows_total", "pod", "web", "path", "learned_direct",
		"outcome", "reset_after_ack", "evidence", "sent_no_response"); got != 5 {
		t.Errorf("reset_after_ack = %v", got)
	}
	if got := promtest.CounterSum(t, reg, "egret_agent_direct_flows_total", "evidence", "not_sent"); got != 6*4 {
		t.Errorf("not_sent over paths = %v", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if p.Metric == "egret_agent_direct_flows_total" || p.Metric == "egret_agent_direct_retransmits_total" {
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	}
	for _, mf := range mfs {
		if mf.GetName() == "egret_agent_direct_flows_total" {
			// connects, established, abandoned + 5 failure classes, per path.
			if n := len(mf.GetMetric()); n != 8*len(bpfload.FlowPaths) {
				t.Errorf("%d series, want %d", n, 8*len(bpfload.FlowPaths))
			}
		}
	}
}

// The connections the pods' proxies pass through come out beside the
// direct ones: a passthrough row per pod, protocol and destination in the
// summary, in the status totals, and in the proxy's own metric family.
func TestPassthroughFlowsInSummary(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	pm, err := proxy.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	fake := NewFake()
	src, _ := pods.NewMemory(pods.Pod{Name: "shop/web", Cgroup: "/cg/web", ListenPort: freePort(t)})
	a, err := New(Config{Attacher: fake, Source: src, Registerer: prometheus.NewPedanticRegistry(), Proxy: proxy.Config{Shared: proxy.Shared{Metrics: pm}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "running", func() bool { st, err := a.Pod("shop/web"); return err == nil && st.State == StateRunning })
	st, _ := a.Pod("shop/web")
	fake.SetFlows([]bpfload.PodFlow{{PodID: st.CgroupID, Path: bpfload.PathLearned,
		Stats: bpfload.FlowStats{Connects: 2, Established: 1, ResetAfterAck: 1}}})

	// A real transparent server of the pod's passes a TLS connection
	// through to a closed port, twice: two refused flows.
	web := proxy.Source{Namespace: "shop", Pod: "web"}
	proxytest.Passthrough(t, pm, web)
	proxytest.Passthrough(t, pm, web)

	sum := NewSummarizer(a).Summary(time.Now())
	var pt []DirectSummary
	for _, d := range sum.Direct {
		if d.Path == PathPassthrough {
			pt = append(pt, d)
		}
	}
	if len(pt) != 1 || len(sum.Direct) != 2 {
		t.Fatalf("direct rows %+v", sum.Direct)
	}
	if d := pt[0]; d.Namespace != "shop" || d.Pod != "web" || d.Protocol != "tls" || d.Destination != "other" ||
		d.Connects != 2 || d.Refused != 2 || d.Established != 0 || d.SafeToRetry != 2 || d.Ambiguous != 0 {
		t.Errorf("passthrough row %+v", d)
	}
	if d := a.Status().Direct; d == nil || d.Connects != 4 || d.SafeToRetry != 2 || d.Ambiguous != 1 {
		t.Errorf("status direct = %+v", d)
	}
	if got := promtest.CounterSum(t, reg, "egret_proxy_passthrough_flows_total", "source_pod", "web",
		"outcome", "refused", "evidence", "not_sent"); got != 2 {
		t.Errorf("refused = %v", got)
	}
}
