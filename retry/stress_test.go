package retry

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	"github.com/egret-proxy/egret/retry/client"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
	"github.com/egret-proxy/egret/witness"
)

// TestConcurrentMixed sends many requests at once through one Transport over
// HTTP/1.1 and h2c to an upstream that answers 503 to every third request
// and resets every seventh connection's request after reading it; every
// request gets exactly one answer, and no POST runs twice.
func TestConcurrentMixed(t *testing.T) {
	var n atomic.Int64
	var mu sync.Mutex
	runs := map[string]int{}
	posts := map[string]bool{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Id")
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		runs[id]++
		mu.Unlock()
		k := n.Add(1)
		switch {
		case k%7 == 0:
			if hj, ok := w.(http.Hijacker); ok {
				c, _, err := hj.Hijack()
				if err == nil {
					rawtest.Reset(c)
					return
				}
			}
			panic(http.ErrAbortHandler)
		case k%3 == 0:
			w.WriteHeader(503)
		default:
			io.WriteString(w, "ok")
		}
	})
	srv := httptest.NewServer(h2c.NewHandler(h, &http2.Server{}))
	defer srv.Close()
	for _, h2 := range []bool{false, true} {
		name := "http1"
		if h2 {
			name = "h2c"
		}
		t.Run(name, func(t *testing.T) {
			tr, _, _ := testTransport(t, nil)
			base := client.NewHTTPTransport(client.HTTPOptions{H2C: h2})
			t.Cleanup(base.CloseIdleConnections)
			tr.Base = base
			tr.Witness = witness.TCPInfo{}
			var wg sync.WaitGroup
			var answers, ambiguous atomic.Int64
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 40 {
						method := http.MethodGet
						if i%2 == 1 {
							method = http.MethodPost
						}
						req, _ := http.NewRequest(method, srv.URL, nil)
						if method == http.MethodPost {
							req = rawtest.Post(t, srv.URL, "payload")
						}
						id := fmt.Sprintf("%s-%d-%d", name, g, i)
						req.Header.Set("X-Id", id)
						if method == http.MethodPost {
							mu.Lock()
							posts[id] = true
							mu.Unlock()
						}
						resp, err := tr.RoundTrip(req)
						answers.Add(1)
						if err != nil {
							var a *AmbiguousError
							var e *Error
							switch {
							case errors.As(err, &a):
								ambiguous.Add(1)
							case errors.As(err, &e):
							default:
								t.Errorf("untyped error %v", err)
							}
							continue
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}()
			}
			wg.Wait()
			if answers.Load() != 8*40 {
				t.Fatalf("%d answers", answers.Load())
			}
			mu.Lock()
			defer mu.Unlock()
			for id, k := range runs {
				if posts[id] && k > 1 {
					t.Errorf("POST %s ran %d times", id, k)
				}
			}
			t.Logf("%s: %d answers, %d ambiguous", name, answers.Load(), ambiguous.Load())
		})
	}
}
