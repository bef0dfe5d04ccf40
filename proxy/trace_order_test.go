package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestTraceStoredBeforeTheAnswerEnds: once a client has read its whole
// answer, the request's trace is there to explain it (egret explain, the
// node page) — for a relayed body of any framing and size, a body-less
// answer, and an answer egret makes itself (ambiguous). Before the trace
// was stored after the answer's last flush, and a quick reader could miss
// it (TestStandaloneSummary failed so under load).
func TestTraceStoredBeforeTheAnswerEnds(t *testing.T) {
	large := strings.Repeat("l", 100<<10)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/small":
			io.WriteString(w, "ok")
		case "/large":
			io.WriteString(w, large)
		case "/chunked":
			io.WriteString(w, "part one ")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part two")
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/cut":
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				c.Close() // no answer: an ambiguous POST
			}
		}
	})
	p := startProxy(t, Config{})
	c := p.client()
	for _, tc := range []struct{ method, path, want string }{
		{"GET", "/small", "ok"},
		{"GET", "/large", large},
		{"GET", "/chunked", "part one part two"},
		{"HEAD", "/small", ""},
		{"GET", "/empty", ""},
		{"POST", "/cut", ""},
	} {
		for i := range 100 {
			req, _ := http.NewRequest(tc.method, up.url(tc.path), strings.NewReader("body"))
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", tc.method, tc.path, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("%s %s: body: %v", tc.method, tc.path, err)
			}
			if tc.path != "/cut" && string(b) != tc.want {
				t.Fatalf("%s %s: %d bytes, want %d", tc.method, tc.path, len(b), len(tc.want))
			}
			id := resp.Header.Get(HeaderRequestID)
			if _, ok := p.Traces().Get(id); !ok {
				t.Fatalf("%s %s, request %d: the answer (%d) was read whole and its trace %q is not there",
					tc.method, tc.path, i, resp.StatusCode, id)
			}
		}
	}
}
