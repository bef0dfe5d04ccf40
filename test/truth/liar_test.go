package truth

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/test/ledger"
)

// naiveProxy is the retrying proxy egret must not be: it retries every
// failure and every 5xx whatever the method, and calls every failure
// "not-sent". The suite's checks must catch it.
type naiveProxy struct {
	rt  *http.Transport
	ids atomic.Int64
}

func (p *naiveProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	w.Header().Set("Egret-Request-Id", fmt.Sprint(p.ids.Add(1)))
	var resp *http.Response
	attempts := 0
	for attempts < maxAttempts {
		attempts++
		out, _ := http.NewRequest(r.Method, r.URL.String(), bytes.NewReader(body))
		out.Header = r.Header.Clone()
		out.Header.Del("Proxy-Connection")
		resp, err = p.rt.RoundTrip(out)
		if err == nil && resp.StatusCode < 500 {
			break
		}
		if err == nil && attempts < maxAttempts {
			resp.Body.Close()
		}
	}
	w.Header().Set("Egret-Attempts", fmt.Sprint(attempts))
	if err != nil {
		w.Header().Set("Egret-Outcome", "not-sent")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

// TestSuiteCatchesANaiveProxy runs the truth checks against naiveProxy: they
// must find duplicate executions of non-idempotent requests and not-sent
// answers for executed ones. It shows the suite can fail.
func TestSuiteCatchesANaiveProxy(t *testing.T) {
	u := startUpstreams(t)
	rt := &http.Transport{ResponseHeaderTimeout: time.Second, MaxIdleConnsPerHost: 16}
	defer rt.CloseIdleConnections()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: &naiveProxy{rt: rt}, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	c := client(&url.URL{Scheme: "http", Host: ln.Addr().String()}, 16)

	var specs []spec
	for _, s := range plan(1, 4000) {
		if s.target == targetH1 && s.size <= spoolLimit && s.fault.Kind != ledger.KindHold {
			specs = append(specs, s)
		}
	}
	answers := make([]answer, len(specs))
	var wg sync.WaitGroup
	work := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				answers[i] = do(c, u.request(specs[i]))
			}
		}()
	}
	for i := range specs {
		work <- i
	}
	close(work)
	wg.Wait()
	v := check(specs, answers, u.ledger.Records(), u.ledger.Stats(), nil)
	for _, rule := range []string{"duplicate execution of a non-idempotent request", "not-sent but executed"} {
		if v.byRule[rule] == 0 {
			t.Errorf("the checks did not catch the naive proxy's %q", rule)
		}
	}
	t.Logf("against a naive proxy (%d requests), the checks found:\n%s", len(specs), joinLines(v.report()))
}

func joinLines(ls []string) string {
	var b bytes.Buffer
	for _, l := range ls {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}
