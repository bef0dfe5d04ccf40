// Package metricslint runs promlint over the metrics egret exposes, taken
// from real units after real traffic, so that every family that shows up
// on a node's /metrics is linted.
package metricslint

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
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

	var n atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/flaky" && n.Add(1) == 1 {
			rw.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(rw, "ok")
	}))
	defer up.Close()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := closed.Addr().String()
	closed.Close()

	srv, err := proxy.New(proxy.Config{
		Mode: proxy.Explicit, Policy: w, Budgets: engine.NewBudgets(), Bulkheads: proxy.NewBulkheads(),
		Traces: proxy.NewTraces(16), Metrics: pm, RetryMetrics: rm,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()

	purl, _ := url.Parse("http://" + ln.Addr().String())
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(purl)}}
	for _, target := range []string{up.URL + "/ok", up.URL + "/flaky", "http://" + deadAddr + "/"} {
		resp, err := client.Get(target)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

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
		"egret_retry_attempts_total", "egret_retry_witness_upgrades_total"} {
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
