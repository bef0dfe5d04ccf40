package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/dashboard"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/internal/testkit/browsertest"
)

// podCell is the JavaScript of the text of column col (from 1) of pod's
// row in the node page's pods table.
func podCell(pod string, col int) string {
	return fmt.Sprintf(`(() => { for (const r of document.querySelectorAll("#pods tbody tr")) { const c = r.cells;
  if (c.length > %d && c[1].innerText.trim() === %q) return c[%d].innerText.trim(); } return null; })()`, col-1, pod, col-1)
}

// TestNodePageTwoPods: two pods (real cgroups and namespaces, eBPF
// redirection) behind a real agent send to two upstreams; the node page,
// in headless Chromium, shows each pod with its workload and its own
// growing counts, both upstreams, and the one pod's ambiguous request,
// whose explanation names that pod.
func TestNodePageTwoPods(t *testing.T) {
	// The browser first: its processes stay out of the agent's cgroup.
	b := browsertest.Start(t)
	n := newNode(t, nodeOpts{})
	web := n.addPod(t, "shop/web", podOpts{spec: pods.Pod{Workload: "deployment/web"}})
	worker := n.addPod(t, "shop/worker", podOpts{spec: pods.Pod{Workload: "statefulset/worker"}})
	_, orders := startLedger(t, web.host4)
	_, stock := startLedger(t, web.host4)
	srv := httptest.NewServer(dashboard.Handler(agent.NewSummarizer(n.agent), n.agent))
	t.Cleanup(srv.Close)

	// Traffic from both pods, with curl in each (bounded, paced): web
	// GETs orders and every fourth round POSTs one the ledger resets after
	// executing (ambiguous); worker GETs stock, retried after a 503.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent atomic.Int64
	loop := func(p *pod, round func(i int) []string) {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := range 1200 {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			args := append([]string{"-sS", "-o", "/dev/null", "--max-time", "10"}, round(i)...)
			if _, err := p.run(t, p.command("curl", args...)); err == nil {
				sent.Add(1)
			}
		}
	}
	wg.Add(2)
	go loop(web, func(i int) []string {
		if i%4 == 3 {
			return []string{"-X", "POST", "-d", "x=1", "-H", "Ledger-Id: web-" + strconv.Itoa(i), "-H", "Ledger-Fault: reset-after-read", url(orders, "/pay")}
		}
		return []string{"-H", "Ledger-Id: web-" + strconv.Itoa(i), url(orders, "/")}
	})
	go loop(worker, func(i int) []string {
		return []string{"-H", "Ledger-Id: worker-" + strconv.Itoa(i), "-H", "Ledger-Fault: 503; times=1", url(stock, "/")}
	})
	t.Cleanup(func() { close(stop); wg.Wait() })

	page := b.NewPage(t)
	browsertest.ScreenshotOnFailure(t, page)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := page.Navigate(ctx, srv.URL+"/"); err != nil {
		t.Fatal(err)
	}
	// Each pod's row: namespace, name, workload, state; its requests
	// counted, then more without a reload.
	for _, p := range []struct{ name, workload string }{{"web", "deployment/web"}, {"worker", "statefulset/worker"}} {
		var row string
		cond := fmt.Sprintf(`(+%s > 0) && [%s, %s, %s, %s].join(" ")`, podCell(p.name, 10),
			podCell(p.name, 1), podCell(p.name, 3), podCell(p.name, 4), podCell(p.name, 10))
		if err := page.WaitFor(ctx, cond, &row); err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(row)
		if len(f) != 4 || f[0] != "shop" || f[1] != p.workload || f[2] != "running" {
			t.Fatalf("pod %s's row %q: want shop %s running N", p.name, row, p.workload)
		}
		n1, _ := strconv.Atoi(f[3])
		var later string
		if err := page.WaitFor(ctx, fmt.Sprintf(`(+%s > %d) && %s`, podCell(p.name, 10), n1, podCell(p.name, 10)), &later); err != nil {
			t.Fatal(err)
		}
		t.Logf("pod %s: %s; requests %d then %s (%d curls so far)", p.name, row, n1, later, sent.Load())
	}
	// The worker's retries are its own; the web pod's ambiguous answers
	// its own.
	var retries, amb string
	if err := page.WaitFor(ctx, fmt.Sprintf(`(+%s > 0) && %s`, podCell("worker", 11), podCell("worker", 11)), &retries); err != nil {
		t.Fatal(err)
	}
	if err := page.WaitFor(ctx, fmt.Sprintf(`(+%s > 0) && %s`, podCell("web", 12), podCell("web", 12)), &amb); err != nil {
		t.Fatal(err)
	}
	var noRetry, noAmb string
	if err := page.Eval(ctx, podCell("web", 11), &noRetry); err != nil || noRetry != "0" {
		t.Errorf("web's retries on the page: %q %v, want 0", noRetry, err)
	}
	if err := page.Eval(ctx, podCell("worker", 12), &noAmb); err != nil || noAmb != "0" {
		t.Errorf("worker's ambiguous on the page: %q %v, want 0", noAmb, err)
	}
	// Which pod got what from which upstream: web's ambiguous answers
	// came from orders, worker's retries from stock; worker never sent
	// to orders.
	flowCell := func(pod, upstream string, col int) string {
		return fmt.Sprintf(`(() => { for (const r of document.querySelectorAll("#flows tbody tr")) { const c = r.cells;
  if (c.length > %d && c[0].innerText.trim() === %q && c[1].innerText.trim() === %q) return c[%d].innerText.trim(); } return null; })()`,
			col-1, pod, upstream, col-1)
	}
	var webOrders, workerStock string
	if err := page.WaitFor(ctx, fmt.Sprintf(`(+%s > 0) && %s`, flowCell("shop/web", orders.String(), 10), flowCell("shop/web", orders.String(), 10)), &webOrders); err != nil {
		t.Fatal(err)
	}
	if err := page.WaitFor(ctx, fmt.Sprintf(`(+%s > 0) && %s`, flowCell("shop/worker", stock.String(), 9), flowCell("shop/worker", stock.String(), 9)), &workerStock); err != nil {
		t.Fatal(err)
	}
	var none any
	if err := page.Eval(ctx, flowCell("shop/worker", orders.String(), 8), &none); err != nil || none != nil {
		t.Errorf("a row for worker to orders: %v %v", none, err)
	}
	t.Logf("pods by upstream: web from orders %s ambiguous, worker from stock %s retries", webOrders, workerStock)
	// Both upstreams have rows.
	for _, u := range []string{orders.String(), stock.String()} {
		if err := page.WaitFor(ctx, fmt.Sprintf(`Array.from(document.querySelectorAll("#upstreams tbody tr"), r => r.cells[0].innerText).includes(%q)`, u), nil); err != nil {
			t.Fatal(err)
		}
	}
	// The ambiguous request is listed with its pod; its explanation
	// names the pod.
	var id string
	if err := page.WaitFor(ctx, fmt.Sprintf(`(() => { for (const r of document.querySelectorAll("#recent tbody tr")) { const c = r.cells;
  if (c.length === 7 && c[5].innerText === "ambiguous" && c[2].innerText === "shop/web" && c[3].innerText === %q) return c[1].innerText; } return null; })()`, orders.String()), &id); err != nil {
		t.Fatal(err)
	}
	if err := page.ClickToLoad(ctx, `#recent a[href="/explain/`+id+`"]`); err != nil {
		t.Fatal(err)
	}
	var pod string
	if err := page.WaitFor(ctx, `document.querySelector("#request dd") && document.querySelector("#request dd").innerText`, &pod); err != nil {
		t.Fatal(err)
	}
	if pod != "shop/web" {
		t.Fatalf("explanation of %s: pod %q, want shop/web", id, pod)
	}
	t.Logf("worker retries %s, web ambiguous %s; ambiguous request %s explained for pod %s", retries, amb, id, pod)
	if pr := page.Problems(); len(pr) > 0 {
		t.Errorf("the page logged errors: %q", pr)
	}
}
