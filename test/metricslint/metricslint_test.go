package metricslint

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/proxy/proxytest"
	"github.com/egret-proxy/egret/retry"
)

func TestPromlintAllMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()

	pfile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pfile, []byte("defaults:\n  max_attempts: 3\n  backoff: {kind: full, base: 1ms, max: 5ms}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := policy.NewWatcher(pfile, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	pm, err := proxy.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	rm, err := retry.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}

	proxytest.Traffic(t, w, pm, rm)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		seen[mf.GetName()] = true
	}
	// The proxy counts requests as answered; the runner under it counts
	// attempts and witness upgrades, each in one family only.
	for _, want := range []string{"egret_proxy_requests_total", "egret_policy_reloads_total",
		"egret_retry_attempts_total", "egret_retry_witness_upgrades_total",
		"egret_proxy_workload_requests_total", "egret_proxy_workload_attempts_total", "egret_proxy_workload_retries_total",
		"egret_proxy_workload_retries_denied_total", "egret_proxy_workload_retry_successes_total"} {
		if !seen[want] {
			t.Errorf("family %s missing after traffic; have %v", want, seen)
		}
	}
	for _, gone := range []string{"egret_proxy_attempts_total", "egret_proxy_retries_total", "egret_proxy_witness_upgrades_total"} {
		if seen[gone] {
			t.Errorf("family %s counts what egret_retry_... counts already", gone)
		}
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	t.Logf("linted %d metric families", len(mfs))
}
