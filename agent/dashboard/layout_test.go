package dashboard

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/internal/testkit/browsertest"
	"github.com/egret-proxy/egret/proxy"
)

// busyNode is a node's figures at their widest: Kubernetes names at their
// usual lengths (a Deployment's pod, a Service's FQDN and port), counts in
// the millions.
type busyNode struct{}

func (busyNode) SummaryParts() agent.SummaryParts {
	const ns = "payments-production-eu-west"
	var p agent.SummaryParts
	for i := range 3 {
		pod := fmt.Sprintf("checkout-api-gateway-7d9f8b6c5d-x2k4%d", i)
		p.Pods = append(p.Pods, agent.PodSummary{Namespace: ns, Pod: pod,
			Workload: "deployment/checkout-api-gateway", State: "running"})
		for j, up := range []string{
			"inventory-reservations.payments-production-eu-west.svc.cluster.local:8443",
			"api.payment-provider-sandbox.example.com:443",
		} {
			p.Counts = append(p.Counts, proxy.WorkloadCounts{
				Source:   proxy.Source{Namespace: ns, Pod: pod, Workload: "deployment/checkout-api-gateway"},
				Upstream: up, Relayed: 12345678, NotSent: 23456, Failed: 34567, Ambiguous: 45678,
				Attempts: 13456789, Retries: 1234567, Denied: 23456, BudgetDenied: 12345 + uint64(j), RetrySuccesses: 1000000,
			})
		}
	}
	for _, path := range []string{"direct_port", "direct_cidr", "learned_direct", "fail_open"} {
		p.Direct = append(p.Direct, agent.DirectSummary{Namespace: ns, Pod: "checkout-api-gateway-7d9f8b6c5d-x2k40",
			Path: path, Connects: 12345678, Established: 12000000, Refused: 123456, TimedOut: 23456, Unreachable: 3456,
			ResetBeforeAck: 45678, ResetAfterAck: 56789, Retransmits: 1234567, SafeToRetry: 196046, Ambiguous: 56789})
	}
	p.Direct = append(p.Direct, agent.DirectSummary{Namespace: ns, Pod: "checkout-api-gateway-7d9f8b6c5d-x2k40",
		Path: agent.PathPassthrough, Protocol: "server_first", Destination: "inventory-reservations.payments-production-eu-west.svc.cluster.local:8443",
		Connects: 12345678, Established: 12000000, Refused: 123456, TimedOut: 23456, Unreachable: 3456,
		ResetBeforeAck: 45678, ResetAfterAck: 56789, Retransmits: 1234567, SafeToRetry: 196046, Ambiguous: 56789})
	p.Budgets = []agent.UpstreamStatus{{Upstream: "api.payment-provider-sandbox.example.com:443", Tokens: 1234.5}}
	for i := range 5 {
		p.Recent = append(p.Recent, agent.RecentRequest{ID: fmt.Sprintf("8e13ac3b035fce9%d", i),
			Pod:      ns + "/checkout-api-gateway-7d9f8b6c5d-x2k40",
			Upstream: "inventory-reservations.payments-production-eu-west.svc.cluster.local:8443",
			Method:   "POST", Outcome: "ambiguous", Reason: "no_response", Time: time.Now()})
	}
	return p
}

// TestNodePageFitsAt1280: the node page of a busy node, in headless
// Chromium 1280 px wide (a laptop's browser), shows every table whole:
// none is wider than the section that holds it, and the page does not
// scroll sideways.
func TestNodePageFitsAt1280(t *testing.T) {
	b := browsertest.Start(t)
	srv := httptest.NewServer(Handler(agent.NewSummarizer(busyNode{}), tracesOf{proxy.NewTraces(1)}))
	defer srv.Close()
	page := b.NewPage(t)
	browsertest.ScreenshotOnFailure(t, page)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := page.Call(ctx, "Emulation.setDeviceMetricsOverride", map[string]any{
		"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false}, nil); err != nil {
		t.Fatal(err)
	}
	if err := page.Navigate(ctx, srv.URL+"/"); err != nil {
		t.Fatal(err)
	}
	// Every table filled: pods, upstreams, pods by upstream, direct, recent.
	var n int
	if err := page.WaitFor(ctx, `document.querySelectorAll("#pods tbody tr td:not(.empty)").length > 0 &&
  document.querySelectorAll("#flows tbody tr td:not(.empty)").length > 0 &&
  document.querySelectorAll("#direct tbody tr td:not(.empty)").length > 0 &&
  document.querySelectorAll("#recent tbody tr td:not(.empty)").length > 0 &&
  document.querySelectorAll("tbody tr").length`, &n); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Viewport int
		Page     int
		Tables   []struct {
			ID               string
			Width, Container float64
		}
	}
	if err := page.Eval(ctx, `({
  viewport: window.innerWidth,
  page: document.documentElement.scrollWidth,
  tables: [...document.querySelectorAll("table")].map(t => ({
    id: t.id, width: t.getBoundingClientRect().width, container: t.parentElement.getBoundingClientRect().width,
  })),
})`, &got); err != nil {
		t.Fatal(err)
	}
	t.Logf("viewport %d px, page %d px wide, %d rows: %+v", got.Viewport, got.Page, n, got.Tables)
	if got.Viewport != 1280 {
		t.Fatalf("viewport %d px, want 1280", got.Viewport)
	}
	if len(got.Tables) != 5 {
		t.Fatalf("%d tables, want 5", len(got.Tables))
	}
	for _, tb := range got.Tables {
		if tb.Width > tb.Container+0.5 {
			t.Errorf("table #%s is %.0f px wide in a %.0f px section", tb.ID, tb.Width, tb.Container)
		}
	}
	if got.Page > got.Viewport {
		t.Errorf("the page is %d px wide in a %d px window: it scrolls sideways", got.Page, got.Viewport)
	}
	// A name broken across lines is still itself, to read and to copy.
	const fqdn = "inventory-reservations.payments-production-eu-west.svc.cluster.local:8443"
	var text string
	if err := page.Eval(ctx, `[...document.querySelectorAll("#upstreams tbody td:first-child")].map(c => c.textContent).join("\n")`, &text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text+"\n", fqdn+"\n") {
		t.Errorf("upstream cells %q, want one that is %q", text, fqdn)
	}
	if pr := page.Problems(); len(pr) > 0 {
		t.Errorf("the page logged errors: %q", pr)
	}
}
