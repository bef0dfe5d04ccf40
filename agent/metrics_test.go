package agent

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/egret-proxy/egret/agent/pods"
)

// TestMetricsLint runs promlint over the agent's metric families after a
// pod came and went.
func TestMetricsLint(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	src, _ := pods.NewMemory(pods.Pod{Name: "web", Cgroup: "/cg/web", ListenPort: freePort(t)})
	a, err := New(Config{Attacher: NewFake(), Source: src, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	eventually(t, "running", func() bool { st, err := a.Pod("web"); return err == nil && st.State == StateRunning })
	_ = src.Remove("web")
	eventually(t, "gone", func() bool { _, err := a.Pod("web"); return err != nil })
	a.SourceError(context.Canceled)
	cancel()
	<-done // Run has returned: every pod's goroutines are done

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		seen[mf.GetName()] = true
	}
	for _, name := range []string{"egret_agent_pods", "egret_agent_pod_events_total", "egret_agent_pod_start_seconds", "egret_agent_pod_source_errors_total"} {
		if !seen[name] {
			t.Errorf("metric %s not gathered", name)
		}
	}
}
