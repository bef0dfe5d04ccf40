package agent

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/witness"
)

// The admin API of a lone proxy (`egret proxy --admin`) answers status,
// upstreams and explain from the proxy's own traces and budgets, and
// explain's JSON has every field under a stable snake_case name: no Go
// field names, "relayed" rather than "" for a relayed response, null
// for what is unknown.
func TestStandaloneAdminAndExplainJSON(t *testing.T) {
	up := flakyUpstream(t)
	budgets := engine.NewBudgets()
	srv, ln := serveProxy(t, proxy.Config{Mode: proxy.Explicit, Shared: proxy.Shared{Budgets: budgets, Witness: witness.TCPInfo{}}})
	ids := flakyAndReset(t, ln, up)
	h := AdminHandler(&Standalone{Server: srv, Budgets: budgets, Status: ProxyStatus{Mode: "explicit", Listen: ln.Addr().String(), Started: time.Now()}})
	get := func(path string, v any) int {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
			t.Fatalf("%s: %v: %s", path, err, rec.Body)
		}
		return rec.Code
	}
	var st map[string]any
	if code := get("/status", &st); code != 200 || st["mode"] != "explicit" || st["traces"] != 2.0 || st["upstreams"] != 1.0 {
		t.Fatalf("/status: %d %v", code, st)
	}
	var ups []UpstreamStatus
	if code := get("/upstreams", &ups); code != 200 || len(ups) != 1 || ups[0].Upstream != strings.TrimPrefix(up.URL, "http://") {
		t.Fatalf("/upstreams: %d %+v", code, ups)
	}
	var nope map[string]string
	if code := get("/explain/0000000000000000", &nope); code != 404 {
		t.Fatalf("/explain of an unknown id: %d %v", code, nope)
	}

	snake := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	keys := func(m map[string]any) []string {
		var k []string
		for key := range m {
			k = append(k, key)
		}
		slices.Sort(k)
		return k
	}
	wantTrace := []string{"attempts", "body", "idempotent", "method", "outcome", "pod", "request_id", "start", "upstream", "url"}
	wantAttempt := []string{"budget", "decision", "duration_ms", "error", "evidence", "failure", "hidden_retries", "idle_bound", "idle_ms", "n", "reason", "reused", "stage", "start", "status", "upgraded", "wait_ms", "witness_after", "witness_before"}
	wantCounters := []string{"bytes_acked", "bytes_received", "bytes_sent", "data_segs_out", "notsent_bytes", "queue_discarded", "reset_at", "reset_received", "retransmits", "rtos", "source", "tcp_state"}
	witnessed := 0
	for path, wantOutcome := range map[string]string{"/flaky": "relayed", "/reset": "ambiguous"} {
		var tv map[string]any
		if code := get("/explain/"+ids[path], &tv); code != 200 {
			t.Fatalf("/explain %s: %d %v", path, code, tv)
		}
		if !slices.Equal(keys(tv), wantTrace) || tv["outcome"] != wantOutcome {
			t.Errorf("%s: trace keys %v outcome %v, want %v %s", path, keys(tv), tv["outcome"], wantTrace, wantOutcome)
		}
		for _, a := range tv["attempts"].([]any) {
			am := a.(map[string]any)
			if !slices.Equal(keys(am), wantAttempt) {
				t.Errorf("%s: attempt keys %v, want %v", path, keys(am), wantAttempt)
			}
			for _, k := range keys(am) {
				if !snake.MatchString(k) {
					t.Errorf("%s: attempt key %q is not snake_case", path, k)
				}
			}
			for _, w := range []string{"witness_before", "witness_after"} {
				if wm, ok := am[w].(map[string]any); ok {
					witnessed++
					if !slices.Equal(keys(wm), wantCounters) || wm["source"] != "tcp_info" {
						t.Errorf("%s: %s keys %v source %v, want %v", path, w, keys(wm), wm["source"], wantCounters)
					}
				}
			}
			if am["failure"] == "" || am["reason"] == "" || am["decision"] == "" {
				t.Errorf("%s: an empty name in %v", path, am)
			}
		}
		if path == "/flaky" {
			at := tv["attempts"].([]any)
			first, second := at[0].(map[string]any), at[1].(map[string]any)
			if len(at) != 2 || first["decision"] != "retry" || first["status"] != 503.0 || first["budget"] == nil ||
				second["status"] != 200.0 || second["failure"] != "none" || second["budget"] != nil {
				t.Errorf("/flaky attempts: %v", at)
			}
		}
	}
	if witnessed == 0 {
		t.Error("no attempt carried witness counters")
	}
}

// flakyUpstream answers its first request 503 and the rest 200, and
// resets every connection that asks for /reset (a request that may have
// run, for an ambiguous answer).
func flakyUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	var n atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/reset" {
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
			return
		}
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(up.Close)
	return up
}

// serveProxy serves a proxy made with cfg on a loopback listener until the
// test ends.
func serveProxy(t *testing.T, cfg proxy.Config) (*proxy.Server, net.Listener) {
	t.Helper()
	srv, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return srv, ln
}

// flakyAndReset sends a GET /flaky (retried: 503 once) and a POST /reset
// (ambiguous) to up through the explicit proxy at ln, and returns each
// answer's request id by path.
func flakyAndReset(t *testing.T, ln net.Listener, up *httptest.Server) map[string]string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()})}}
	ids := map[string]string{}
	for _, r := range []struct{ method, path string }{{"GET", "/flaky"}, {"POST", "/reset"}} {
		req, _ := http.NewRequest(r.method, up.URL+r.path, strings.NewReader("x"))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		ids[r.path] = resp.Header.Get(proxy.HeaderRequestID)
	}
	return ids
}
