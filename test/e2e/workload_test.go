package e2e

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/internal/testkit/promtest"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
)

// settablePolicy is a policy source set once the upstreams' addresses are
// known.
type settablePolicy struct{ p atomic.Pointer[policy.Policy] }

func (s *settablePolicy) Current() *policy.Policy { return s.p.Load() }

// TestWorkloadMetrics: two pods (real cgroups and namespaces, eBPF
// redirection) send to three upstreams; the agent's series say which pod
// (namespace, name, workload) got what from which upstream and why, and a
// deleted pod's series go.
func TestWorkloadMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	pm, err := proxy.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	src := &settablePolicy{}
	src.p.Store(policy.Default())
	n := newNode(t, nodeOpts{proxy: proxy.Config{Policy: src, Shared: proxy.Shared{Metrics: pm}}})
	web := n.addPod(t, "shop/web", podOpts{spec: pods.Pod{Workload: "deployment/web"}})
	worker := n.addPod(t, "shop/worker", podOpts{spec: pods.Pod{Workload: "statefulset/worker"}})
	// Three upstreams on the web pod's host end, reachable from both pods.
	_, payments := startLedger(t, web.host4)
	_, orders := startLedger(t, web.host4)
	_, stock := startLedger(t, web.host4)
	// The policy names the first; every upstream's budget holds one retry
	// token, none earned.
	p, err := policy.Parse("node.yaml", []byte(fmt.Sprintf(`
defaults:
  backoff: {kind: full, base: 1ms, max: 5ms}
  budget: {ratio: 0, min_per_second: 0.1, ttl: 10s}
upstreams:
  - host: %s
    port: %d
    name: payments
`, payments.Addr(), payments.Port())))
	if err != nil {
		t.Fatal(err)
	}
	src.p.Store(p)

	do := func(pd *pod, id, fault, method, u string, wantStatus, wantAttempts int) {
		t.Helper()
		args := []string{"-X", method, "-H", "Ledger-Id: " + id}
		if fault != "" {
			args = append(args, "-H", "Ledger-Fault: "+fault)
		}
		if method == "POST" {
			args = append(args, "-d", "x=1")
		}
		r := pd.curl(t, append(args, u)...)
		if r.Status != wantStatus || attempts(r) != wantAttempts {
			t.Fatalf("%s %s %s (%s): status %d attempts %d, want %d %d", id, method, u, fault, r.Status, attempts(r), wantStatus, wantAttempts)
		}
	}
	do(web, "w1", "503; times=1", "GET", url(payments, "/"), 200, 2)       // retried: a success
	do(worker, "k1", "503; times=1", "GET", url(payments, "/"), 503, 1)    // the node's token is spent
	do(web, "w2", "reset-after-read", "POST", url(orders, "/pay"), 502, 1) // ambiguous
	do(worker, "k2", "", "GET", url(orders, "/"), 200, 1)
	do(worker, "k3", "", "GET", url(stock, "/"), 200, 1)
	do(web, "w3", "", "GET", url(stock, "/"), 200, 1)

	ordersName := orders.String()
	shop := []string{"source_namespace", "shop"}
	for _, c := range []struct {
		family string
		labels []string
		want   float64
	}{
		{"egret_proxy_workload_requests_total", []string{"source_pod", "web", "source_workload", "deployment/web", "upstream", "payments", "outcome", "relayed"}, 1},
		{"egret_proxy_workload_retry_successes_total", []string{"source_pod", "web", "upstream", "payments"}, 1},
		{"egret_proxy_workload_retries_total", []string{"source_pod", "web", "upstream", "payments", "reason", "status"}, 1},
		{"egret_proxy_workload_retries_denied_total", []string{"source_pod", "worker", "source_workload", "statefulset/worker", "upstream", "payments", "decision", "deny", "reason", "budget_exhausted"}, 1},
		{"egret_proxy_workload_requests_total", []string{"source_pod", "web", "upstream", ordersName, "outcome", "ambiguous"}, 1},
		{"egret_proxy_workload_retries_denied_total", []string{"source_pod", "web", "upstream", ordersName, "decision", "ambiguous", "reason", "no_response"}, 1},
		{"egret_proxy_workload_requests_total", []string{"source_pod", "worker", "upstream", ordersName, "outcome", "relayed"}, 1},
		{"egret_proxy_workload_requests_total", []string{"upstream", stock.String(), "outcome", "relayed"}, 2},
		{"egret_proxy_workload_attempts_total", nil, 7},
	} {
		if got := promtest.CounterSum(t, reg, c.family, append(shop, c.labels...)...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.family, c.labels, got, c.want)
		}
	}
	series := func(pod string) int {
		fams, _ := reg.Gather()
		k := 0
		for _, f := range fams {
			if !strings.HasPrefix(f.GetName(), "egret_proxy_workload_") {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "source_pod" && l.GetValue() == pod {
						k++
					}
				}
			}
		}
		return k
	}
	before := series("web")
	if before == 0 || series("worker") == 0 {
		t.Fatalf("series: web %d, worker %d", before, series("worker"))
	}
	// The web pod is deleted: once it has drained, its series are gone.
	if err := n.src.Remove("shop/web"); err != nil {
		t.Fatal(err)
	}
	// Polls the metrics, which announce nothing.
	if !testenv.Poll(10*time.Second, func() bool { return series("web") == 0 }) {
		t.Fatalf("the deleted pod still has %d series", series("web"))
	}
	t.Logf("web had %d workload series, gone after its deletion; worker keeps %d", before, series("worker"))
	if series("worker") == 0 {
		t.Fatal("the other pod's series went too")
	}
}
