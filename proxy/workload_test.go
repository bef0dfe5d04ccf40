package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/internal/testkit/promtest"
)

// fakeClock is an injected clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// workloadSeries lists the label sets of family name's series, as
// "pod upstream label=value..." strings with the given extra labels.
func workloadSeriesOf(t *testing.T, g prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var parts []string
			for _, l := range m.GetLabel() {
				parts = append(parts, l.GetName()+"="+l.GetValue())
			}
			out[strings.Join(parts, ",")] = m.GetCounter().GetValue()
		}
	}
	return out
}

// Two pods send to three upstreams through their own servers sharing one
// Metrics: each series says which pod (namespace, pod, workload), which
// upstream (the policy's name; unnamed ones up to the cap, then other),
// what was answered, and why retries happened or not. A deleted pod's
// series go at once; an idle one's after the TTL.
func TestWorkloadSeries(t *testing.T) {
	ledger := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/reset" {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		w.Write([]byte("ok"))
	})
	var flips atomic.Int64
	flaky := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if flips.Add(1)%2 == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	down := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	_, lport, _ := strings.Cut(ledger.addr, ":")
	// Every budget holds 1 token: the second retry to an upstream is
	// denied budget_exhausted.
	pol := mustPolicy(t, fmt.Sprintf(`
defaults:
  max_attempts: 3
  backoff: {kind: full, base: 1ms, max: 2ms}
  budget: {ratio: 0.01, min_per_second: 0.1, ttl: 10s}
upstreams:
  - host: 127.0.0.1
    port: %s
    name: ledger
`, lport))
	clock := &fakeClock{now: time.Unix(1_000_000, 0)}
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetricsWith(reg, WorkloadOptions{UpstreamCap: 1, TTL: time.Minute, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	web := Source{Namespace: "shop", Pod: "web-7d9f-abcde", Workload: "deployment/web"}
	worker := Source{Namespace: "shop", Pod: "worker-0", Workload: "statefulset/worker"}
	pw := startProxy(t, Config{Mode: Explicit, Policy: pol, Shared: Shared{Metrics: m}, Source: web})
	pk := startProxy(t, Config{
		Mode:   Explicit,
		Policy: pol,
		Shared: Shared{Metrics: m, Budgets: pw.cfg.Budgets, Bulkheads: pw.cfg.Bulkheads},
		Source: worker,
	})
	send := func(p *testProxy, method, url string, wantStatus int) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader("x"))
		resp, err := p.client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s %s: status %d, want %d", method, url, resp.StatusCode, wantStatus)
		}
	}
	send(pw, "GET", ledger.url("/"), 200)
	send(pw, "POST", ledger.url("/reset"), 502) // ambiguous
	send(pk, "GET", ledger.url("/"), 200)
	send(pw, "GET", flaky.url("/"), 200) // 503, retry, 200
	send(pk, "GET", flaky.url("/"), 503) // 503, budget spent
	send(pw, "GET", down.url("/"), 503)  // other: 503, retry, 503, budget spent
	send(pk, "GET", down.url("/"), 503)  // other: 503, budget spent

	flakyName := flaky.addr
	sum := func(name string, kv ...string) float64 { return promtest.CounterSum(t, reg, name, kv...) }
	checks := []struct {
		family string
		labels []string
		want   float64
	}{
		{"egret_proxy_workload_requests_total", []string{"source_pod", web.Pod, "source_namespace", "shop", "source_workload", "deployment/web", "upstream", "ledger", "outcome", "relayed"}, 1},
		{"egret_proxy_workload_requests_total", []string{"source_pod", web.Pod, "upstream", "ledger", "outcome", "ambiguous"}, 1},
		{"egret_proxy_workload_retries_denied_total", []string{"source_pod", web.Pod, "upstream", "ledger", "decision", "ambiguous", "reason", "no_response"}, 1},
		{"egret_proxy_workload_requests_total", []string{"source_pod", worker.Pod, "source_workload", "statefulset/worker", "upstream", "ledger", "outcome", "relayed"}, 1},
		{"egret_proxy_workload_attempts_total", []string{"source_pod", web.Pod, "upstream", flakyName}, 2},
		{"egret_proxy_workload_retries_total", []string{"source_pod", web.Pod, "upstream", flakyName, "reason", "status"}, 1},
		{"egret_proxy_workload_retry_successes_total", []string{"source_pod", web.Pod, "upstream", flakyName}, 1},
		{"egret_proxy_workload_retries_denied_total", []string{"source_pod", worker.Pod, "upstream", flakyName, "decision", "deny", "reason", "budget_exhausted"}, 1},
		{"egret_proxy_workload_retry_successes_total", []string{"source_pod", worker.Pod, "upstream", flakyName}, 0},
		{"egret_proxy_workload_requests_total", []string{"upstream", down.addr}, 0},
		{"egret_proxy_workload_requests_total", []string{"source_pod", web.Pod, "upstream", OtherUpstream, "outcome", "relayed"}, 1},
		{"egret_proxy_workload_retries_total", []string{"source_pod", web.Pod, "upstream", OtherUpstream, "reason", "status"}, 1},
		{"egret_proxy_workload_retries_denied_total", []string{"upstream", OtherUpstream, "reason", "budget_exhausted"}, 2},
		{"egret_proxy_workload_attempts_total", []string{"upstream", OtherUpstream}, 3},
	}
	for _, c := range checks {
		if got := sum(c.family, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.family, c.labels, got, c.want)
		}
	}
	if t.Failed() {
		t.Logf("series: %v", workloadSeriesOf(t, reg, "egret_proxy_workload_requests_total"))
		t.Logf("denied: %v", workloadSeriesOf(t, reg, "egret_proxy_workload_retries_denied_total"))
		t.FailNow()
	}
	if n := len(workloadSeriesOf(t, reg, "egret_proxy_workload_attempts_total")); n != 6 {
		t.Errorf("%d attempt series, want 6 (2 pods x ledger, %s, other)", n, flakyName)
	}

	// The web pod is deleted: its series go at once, the worker's stay.
	m.Forget(web)
	if got := sum("egret_proxy_workload_attempts_total", "source_pod", web.Pod); got != 0 || len(workloadSeriesOf(t, reg, "egret_proxy_workload_attempts_total")) != 3 {
		t.Fatalf("after Forget(web): %v", workloadSeriesOf(t, reg, "egret_proxy_workload_attempts_total"))
	}
	// The worker keeps using the ledger only; past the TTL the idle
	// series are gone, and the freed place under the cap goes to the
	// next new upstream.
	clock.Add(45 * time.Second)
	send(pk, "GET", ledger.url("/"), 200)
	clock.Add(30 * time.Second)
	got := workloadSeriesOf(t, reg, "egret_proxy_workload_attempts_total")
	if len(got) != 1 || got["source_namespace=shop,source_pod=worker-0,source_workload=statefulset/worker,upstream=ledger"] != 2 {
		t.Fatalf("after the TTL: %v, want the worker's ledger series alone", got)
	}
	send(pk, "GET", down.url("/"), 503)
	if got := sum("egret_proxy_workload_requests_total", "source_pod", worker.Pod, "upstream", down.addr); got != 1 {
		t.Fatalf("a new upstream after the TTL freed the cap: %v under its own name, want 1; %v", got,
			workloadSeriesOf(t, reg, "egret_proxy_workload_requests_total"))
	}
}

// The budget gauge keeps to the upstreams with a label of their own (the
// rest are one series, other, their least budget) and forgets an upstream
// idle past its budget's TTL.
func TestBudgetSeriesBoundedAndForgotten(t *testing.T) {
	ok := func(w http.ResponseWriter, r *http.Request) {}
	ups := []*upstream{startUpstream(t, ok), startUpstream(t, ok), startUpstream(t, ok), startUpstream(t, ok)}
	_, lport, _ := strings.Cut(ups[0].addr, ":")
	pol := mustPolicy(t, fmt.Sprintf(`
defaults:
  budget: {ratio: 0.5, min_per_second: 1, ttl: 10s}
upstreams:
  - host: 127.0.0.1
    port: %s
    name: ledger
`, lport))
	clock := &fakeClock{now: time.Now()}
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetricsWith(reg, WorkloadOptions{UpstreamCap: 1, TTL: time.Minute, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, Config{Mode: Explicit, Policy: pol, Shared: Shared{Metrics: m}})
	for _, u := range ups {
		resp, err := p.client().Get(u.url("/"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// The budgets were last used at the requests' real times, which a
	// loaded machine may take seconds to reach: the clock starts from
	// after them, so that 11 s on it are past the TTL for every budget.
	clock.Set(time.Now())
	gauges := func() map[string]float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, f := range fams {
			if f.GetName() == "egret_proxy_retry_budget_tokens" {
				for _, s := range f.GetMetric() {
					out[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
				}
			}
		}
		return out
	}
	got := gauges()
	if len(got) != 3 || got["ledger"] == 0 || got[ups[1].addr] == 0 || got[OtherUpstream] == 0 {
		t.Fatalf("budget series %v, want ledger, %s and other", got, ups[1].addr)
	}
	if p.cfg.Budgets.Len() != 4 {
		t.Fatalf("the registry holds %d budgets, want 4", p.cfg.Budgets.Len())
	}
	clock.Add(11 * time.Second) // past the budgets' TTL, not the series'
	if got := gauges(); len(got) != 0 || p.cfg.Budgets.Len() != 0 {
		t.Fatalf("after the budgets' TTL: series %v, %d budgets held; want none", got, p.cfg.Budgets.Len())
	}
}

// BenchmarkWorkloadRecord: the per-workload count of one request, from
// every core at once, in the steady state (the series exist).
func BenchmarkWorkloadRecord(b *testing.B) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	src := Source{Namespace: "shop", Pod: "web-7d9f-abcde", Workload: "deployment/web"}
	tr := &retryTrace{Attempts: make([]retryAttempt, 2)}
	tr.Attempts[0].Status, tr.Attempts[1].Status = 503, 200
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Workload(src, "api.example.com:443", false, labelRelayed, 2, tr)
		}
	})
}
