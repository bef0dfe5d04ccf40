package agent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/retry"
)

// partsOf is a SummarySource over real per-workload counters and
// budgets, with the pods it is told.
type partsOf struct {
	m       *proxy.Metrics
	budgets *engine.Budgets
	pods    []PodSummary
	now     func() time.Time
}

func (p partsOf) SummaryParts() SummaryParts {
	var b []UpstreamStatus
	p.budgets.Each(func(u string, bud *engine.Budget) {
		b = append(b, UpstreamStatus{Upstream: u, Tokens: bud.Tokens(p.now())})
	})
	return SummaryParts{Pods: p.pods, Counts: p.m.WorkloadCounts(), Budgets: b}
}

// The summary sums the counters by pod and by upstream, joins the
// budgets, lists a pod with no traffic, and measures rates between
// samples at least a second apart over at most RateWindow.
func TestSummarizerCountsAndRates(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	now := t0
	m, err := proxy.NewMetricsWith(nil, proxy.WorkloadOptions{Now: func() time.Time { return now }, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	budgets := engine.NewBudgets()
	budgets.Get("orders", engine.BudgetConfig{Ratio: 0.2, MinPerSecond: 10, TTL: 10 * time.Second}, t0)
	src := partsOf{m: m, budgets: budgets, now: func() time.Time { return now },
		pods: []PodSummary{{Namespace: "shop", Pod: "web", Workload: "deployment/web", State: StateRunning},
			{Namespace: "shop", Pod: "idle", State: StateRunning}}}
	web := proxy.Source{Namespace: "shop", Pod: "web", Workload: "deployment/web"}
	worker := proxy.Source{Namespace: "shop", Pod: "worker", Workload: "statefulset/worker"}
	retried := &retry.Trace{Attempts: []retry.Attempt{
		{Failure: engine.ConnectRefused, Decision: engine.Result{Decision: engine.Retry, Reason: engine.ReasonNotSent}},
		{Status: 200}}}
	send := func(src proxy.Source, upstream, outcome string, n int, tr *retry.Trace) {
		for range n {
			m.Workload(src, upstream, true, outcome, 1, tr)
		}
	}
	send(web, "orders", "relayed", 4, nil)
	send(web, "stock", "ambiguous", 2, nil)
	send(worker, "orders", "relayed", 3, retried)
	sum := NewSummarizer(src)

	s := sum.Summary(t0)
	if s.WindowSeconds != 0 || len(s.Pods) != 3 || len(s.Upstreams) != 2 {
		t.Fatalf("first summary: window %v, %d pods, %d upstreams: %+v", s.WindowSeconds, len(s.Pods), len(s.Upstreams), s)
	}
	pod := map[string]PodSummary{}
	for _, p := range s.Pods {
		pod[p.Pod] = p
	}
	if w := pod["web"]; w.Counts.Requests != 6 || w.Counts.Ambiguous != 2 || w.Workload != "deployment/web" || w.State != StateRunning {
		t.Fatalf("web: %+v", w)
	}
	if w := pod["worker"]; w.Counts.Requests != 3 || w.Counts.Retries != 3 || w.Counts.RetrySuccesses != 3 || w.State != "" || w.Workload != "statefulset/worker" {
		t.Fatalf("worker (gone from the pods, series still held): %+v", w)
	}
	if p := pod["idle"]; p.Counts != (Counts{}) {
		t.Fatalf("idle: %+v", p)
	}
	up := map[string]UpstreamSummary{}
	for _, u := range s.Upstreams {
		up[u.Upstream] = u
	}
	if o := up["orders"]; o.Counts.Requests != 7 || o.Counts.Retries != 3 || o.BudgetTokens == nil {
		t.Fatalf("orders: %+v", o)
	}
	if st := up["stock"]; st.Counts.Ambiguous != 2 || st.BudgetTokens != nil {
		t.Fatalf("stock (no budget in use): %+v", st)
	}
	// Which pod got what from which upstream.
	var flows []string
	for _, f := range s.Flows {
		flows = append(flows, fmt.Sprintf("%s/%s>%s:%d/%d/%d", f.Namespace, f.Pod, f.Upstream, f.Counts.Requests, f.Counts.Retries, f.Counts.Ambiguous))
	}
	if got, want := strings.Join(flows, " "), "shop/web>orders:4/0/0 shop/web>stock:2/0/2 shop/worker>orders:3/3/0"; got != want {
		t.Fatalf("flows %q, want %q", got, want)
	}

	// 10 more requests of web to orders over 2 s: 5/s.
	now = t0.Add(2 * time.Second)
	send(web, "orders", "relayed", 10, nil)
	s = sum.Summary(now)
	if s.WindowSeconds != 2 || s.Pods[1].Pod != "web" || s.Pods[1].Rates.Requests != 5 {
		t.Fatalf("after 2 s: window %v, pods %+v", s.WindowSeconds, s.Pods)
	}
	// Half a second later: no new sample, the rate still from t0.
	now = t0.Add(2500 * time.Millisecond)
	send(web, "stock", "not-sent", 5, nil)
	s = sum.Summary(now)
	for _, u := range s.Upstreams {
		if u.Upstream == "stock" && (u.Rates.NotSent != 2 || s.WindowSeconds != 2.5) {
			t.Fatalf("after 2.5 s: window %v, stock %+v", s.WindowSeconds, u)
		}
	}
	// Past the window: t0's sample is forgotten, t0+2s's is the base.
	now = t0.Add(11 * time.Second)
	s = sum.Summary(now)
	if s.WindowSeconds != 9 {
		t.Fatalf("after 11 s: window %v, want 9 (from the sample at 2 s)", s.WindowSeconds)
	}
	for _, p := range s.Pods {
		if p.Pod == "web" && p.Rates.NotSent != 5.0/9 {
			t.Fatalf("web after 11 s: %+v", p.Rates)
		}
	}
	for _, f := range s.Flows {
		if f.Pod == "web" && f.Upstream == "stock" && f.Rates.NotSent != 5.0/9 {
			t.Fatalf("web to stock after 11 s: %+v", f.Rates)
		}
	}
}
