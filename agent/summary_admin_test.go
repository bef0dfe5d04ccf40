package agent

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/witness"
)

// GET /summary of a lone proxy's admin API, after a retried GET and an
// ambiguous POST through it: the upstream's row counts both, its budget
// is there, and the POST is listed with its reason.
func TestStandaloneSummary(t *testing.T) {
	up := flakyUpstream(t)
	upstream := strings.TrimPrefix(up.URL, "http://")
	pm, err := proxy.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	budgets := engine.NewBudgets()
	srv, ln := serveProxy(t, proxy.Config{Mode: proxy.Explicit, Shared: proxy.Shared{Budgets: budgets, Witness: witness.TCPInfo{}, Metrics: pm}})
	ids := flakyAndReset(t, ln, up)
	h := AdminHandler(&Standalone{Server: srv, Budgets: budgets, Status: ProxyStatus{Mode: "explicit", Started: time.Now()}})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/summary", nil))
	var s Summary
	if err := json.Unmarshal(rec.Body.Bytes(), &s); rec.Code != 200 || err != nil {
		t.Fatalf("/summary: %d %v: %s", rec.Code, err, rec.Body)
	}
	if len(s.Pods) != 0 || len(s.Upstreams) != 1 {
		t.Fatalf("/summary: %s", rec.Body)
	}
	u := s.Upstreams[0]
	if u.Upstream != upstream || u.Counts.Requests != 2 || u.Counts.Retries != 1 || u.Counts.Ambiguous != 1 ||
		u.Counts.RetrySuccesses != 1 || u.BudgetTokens == nil {
		t.Fatalf("upstream row: %s", rec.Body)
	}
	if len(s.Recent) != 1 || s.Recent[0].ID != ids["/reset"] || s.Recent[0].Outcome != "ambiguous" ||
		s.Recent[0].Reason != "no_response" || s.Recent[0].Method != "POST" || s.Recent[0].Upstream != upstream {
		t.Fatalf("recent: %+v", s.Recent)
	}
	for _, field := range []string{`"window_seconds"`, `"budget_tokens"`, `"not_sent"`, `"retry_successes"`} {
		if !strings.Contains(rec.Body.String(), field) {
			t.Errorf("/summary has no %s: %s", field, rec.Body)
		}
	}
}
