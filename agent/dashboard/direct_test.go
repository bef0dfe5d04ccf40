package dashboard

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/internal/testkit/browsertest"
	"github.com/egret-proxy/egret/proxy"
)

// directNode has two pods' direct connections and one's connections
// passed through: what egret does not retry.
type directNode struct{}

func (directNode) SummaryParts() agent.SummaryParts {
	return agent.SummaryParts{Direct: []agent.DirectSummary{
		{Namespace: "shop", Pod: "web", Path: "learned_direct", Connects: 60, Established: 20, Refused: 30,
			TimedOut: 10, ResetAfterAck: 3, Retransmits: 12, SafeToRetry: 40, Ambiguous: 3},
		{Namespace: "shop", Pod: "db", Path: "direct_port", Connects: 5, Established: 5, ResetBeforeAck: 2,
			Ambiguous: 2},
		{Namespace: "shop", Pod: "pay", Path: agent.PathPassthrough, Protocol: "tls", Destination: "api.example.com:443",
			Connects: 7, Established: 6, Refused: 1, ResetAfterAck: 3, Retransmits: 4, SafeToRetry: 1, Ambiguous: 3},
	}}
}

// TestNodePageShowsDirect: the node page, in headless Chromium, shows the
// connections egret left direct per pod and path and those it passed
// through per pod, protocol and destination (a TLS server name), how they
// failed, and how many failures a retry could have fixed safely.
func TestNodePageShowsDirect(t *testing.T) {
	b := browsertest.Start(t)
	srv := httptest.NewServer(Handler(agent.NewSummarizer(directNode{}), tracesOf{proxy.NewTraces(1)}))
	defer srv.Close()
	page := b.NewPage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := page.Navigate(ctx, srv.URL+"/"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := page.WaitFor(ctx, `document.querySelectorAll("#direct tbody tr td:not(.empty)").length`, &n); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Safe string
		Rows []string
	}
	if err := page.Eval(ctx, `({
  safe: document.getElementById("direct-safe").textContent,
  rows: [...document.querySelectorAll("#direct tbody tr")].map(r => [...r.cells].map(c => c.textContent).join("|")),
})`, &got); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s\n%s", got.Safe, strings.Join(got.Rows, "\n"))
	if !strings.HasPrefix(got.Safe, "41 failures a retry could have fixed safely") || !strings.Contains(got.Safe, "8 reset after the connect") {
		t.Errorf("headline %q", got.Safe)
	}
	want := []string{
		"shop/web|learned_direct|–|60|20|30|10|0|0|3|12|40",
		"shop/db|direct_port|–|5|5|0|0|0|2|0|0|0",
		"shop/pay|passthrough/tls|api.example.com:443|7|6|1|0|0|0|3|4|1",
	}
	if strings.Join(got.Rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows\n%s\nwant\n%s", strings.Join(got.Rows, "\n"), strings.Join(want, "\n"))
	}
	if pr := page.Problems(); len(pr) > 0 {
		t.Errorf("the page logged errors: %q", pr)
	}
}
