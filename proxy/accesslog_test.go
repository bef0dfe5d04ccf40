package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// syncBuffer is a bytes.Buffer safe for the proxy's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// Each access-log choice logs what it says, and every request line says
// the reason of the last decision.
func TestAccessLogLevels(t *testing.T) {
	var flips atomic.Int64
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/missing":
			w.WriteHeader(http.StatusNotFound)
		case "/flaky":
			if flips.Add(1)%2 == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		case "/down":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/reset":
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
		}
	})
	// One token a budget: /flaky's retry spends it, /down's is denied.
	pol := mustPolicy(t, `
defaults:
  backoff: {kind: full, base: 1ms, max: 2ms}
  budget: {ratio: 0, min_per_second: 0.1, ttl: 10s}
`)
	type req struct{ method, path, reason string }
	reqs := []req{
		{"GET", "/ok", "status"},
		{"GET", "/missing", "status"},
		{"POST", "/reset", "no_response"},    // ambiguous (the budget still has its token)
		{"GET", "/flaky", "status"},          // retried, then a success
		{"GET", "/down", "budget_exhausted"}, // denied: the budget
		{"GET", "http://[::1", ""},           // rejected: a bad URL
	}
	errorsLogged := map[string]bool{"/flaky": true, "/down": true, "/reset": true, "http://[::1": true}
	for _, mode := range []AccessLog{AccessLogAll, AccessLogErrors, AccessLogOff} {
		t.Run(mode.String(), func(t *testing.T) {
			flips.Store(0)
			var buf syncBuffer
			p := startProxy(t, Config{
				Mode:   Explicit,
				Policy: pol,
				Shared: Shared{AccessLog: mode},
				Logger: slog.New(slog.NewJSONHandler(&buf, nil)),
			})
			for _, r := range reqs {
				target := up.url(r.path)
				if strings.HasPrefix(r.path, "http") {
					target = r.path
				}
				raw := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx", r.method, target, up.addr)
				rawRequest(t, p.addr, raw)
			}
			p.Shutdown(t.Context())
			got := map[string]map[string]any{}
			for _, l := range buf.lines(t) {
				if l["msg"] != "request" {
					continue
				}
				u, _ := l["url"].(string)
				key := u
				if i := strings.Index(u, up.addr); i >= 0 {
					key = u[i+len(up.addr):]
				}
				if key == "" {
					key = "http://[::1"
				}
				got[key] = l
			}
			for _, r := range reqs {
				want := mode == AccessLogAll || mode == AccessLogErrors && errorsLogged[r.path]
				l, ok := got[r.path]
				if ok != want {
					t.Errorf("%s %s logged %v, want %v (lines %v)", r.method, r.path, ok, want, got)
					continue
				}
				if !ok {
					continue
				}
				wantReason := r.reason
				if wantReason == "" {
					wantReason = "none"
				}
				if l["reason"] != wantReason {
					t.Errorf("%s %s: reason %v, want %s", r.method, r.path, l["reason"], wantReason)
				}
			}
		})
	}
}
