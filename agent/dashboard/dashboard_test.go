package dashboard

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/retry"
)

// tracesOf finds traces in a real trace store (a lone proxy's Trace).
type tracesOf struct{ *proxy.Traces }

func (t tracesOf) Trace(id string) (retry.Trace, string, bool) {
	tr, ok := t.Get(id)
	return tr, "shop/web", ok
}

func (t tracesOf) SummaryParts() agent.SummaryParts { return agent.SummaryParts{} }

// Every answer carries the strict CSP; the page's paths answer, others
// and malformed ids do not; an explanation has no query string, user
// information or fragment, in its URL or in its errors.
func TestHandler(t *testing.T) {
	traces := proxy.NewTraces(8)
	traces.Put(&retry.Trace{
		RequestID: "0123456789abcdef", Method: "POST", URL: "http://alice:pw@orders:8080/pay?card=4111#frag",
		Upstream: "orders", Outcome: engine.OutcomeAmbiguous,
		Attempts: []retry.Attempt{{N: 1, Err: `Post "http://alice:pw@orders:8080/pay?card=4111": read: connection reset by peer`}},
	})
	src := tracesOf{traces}
	srv := httptest.NewServer(Handler(agent.NewSummarizer(src), src))
	defer srv.Close()
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.Header.Get("Content-Security-Policy") != CSP || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("GET %s: headers %v", path, resp.Header)
		}
		return resp, string(b)
	}
	for path, want := range map[string]string{
		"/": "text/html", "/explain/0123456789abcdef": "text/html", "/assets/app.js": "javascript",
		"/assets/style.css": "text/css", "/api/summary": "application/json", "/api/explain/0123456789abcdef": "application/json",
	} {
		if resp, _ := get(path); resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), want) {
			t.Errorf("GET %s: %d %s, want 200 %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), want)
		}
	}
	for path, want := range map[string]int{"/nothing": 404, "/explain/<script>": 404, "/api/explain/xyz": 400, "/api/explain/fedcba9876543210": 404} {
		if resp, _ := get(path); resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	_, body := get("/api/explain/0123456789abcdef")
	var v agent.TraceView
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	if v.URL != "http://orders:8080/pay" || v.Pod != "shop/web" || v.Outcome != "ambiguous" {
		t.Fatalf("explanation: url %q pod %q outcome %q", v.URL, v.Pod, v.Outcome)
	}
	if want := `Post "http://orders:8080/pay": read: connection reset by peer`; v.Attempts[0].Err != want {
		t.Fatalf("error %q, want %q", v.Attempts[0].Err, want)
	}
	for _, secret := range []string{"4111", "alice", "pw@", "frag"} {
		if strings.Contains(body, secret) {
			t.Fatalf("explanation shows %q: %s", secret, body)
		}
	}
}
