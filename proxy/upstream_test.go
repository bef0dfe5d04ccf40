package proxy

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/testkit/promtest"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/retry"
)

func TestTLSOrigination(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls=%v proto=%s", r.TLS != nil, r.Proto)
	}))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := srv.Listener.Addr().(*net.TCPAddr)
	doc := fmt.Sprintf(`
upstreams:
  - host: 127.0.0.1
    port: %d
    protocol: http1
    tls:
      enabled: true
      ca_file: %s
`, addr.Port, ca)
	p, err := policy.Parse(filepath.Join(dir, "p.yaml"), []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, Config{Policy: StaticPolicy{p}})
	// The client speaks plain HTTP; egret speaks TLS to the upstream.
	resp, err := px.client().Get(fmt.Sprintf("http://127.0.0.1:%d/", addr.Port))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp.Body); got != "tls=true proto=HTTP/1.1" {
		t.Fatalf("upstream saw %q (status %d)", got, resp.StatusCode)
	}
}

// TestTLSOriginationFollowsReloadedCA: a CA file rewritten and reloaded
// takes effect on the next request (the transports are not kept by the
// file's name).
func TestTLSOriginationFollowsReloadedCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	other, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	writeCA := func(der []byte) {
		if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	addr := srv.Listener.Addr().(*net.TCPAddr)
	pfile := filepath.Join(dir, "p.yaml")
	doc := fmt.Sprintf("upstreams:\n  - host: 127.0.0.1\n    port: %d\n    protocol: http1\n    max_attempts: 1\n"+
		"    tls:\n      enabled: true\n      ca_file: %s\n", addr.Port, ca)
	if err := os.WriteFile(pfile, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	writeCA(other)
	w, err := policy.NewWatcher(pfile, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, Config{Policy: w})
	status := func() int {
		resp, err := px.client().Get(fmt.Sprintf("http://127.0.0.1:%d/", addr.Port))
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp.Body)
		return resp.StatusCode
	}
	if got := status(); got != http.StatusServiceUnavailable {
		t.Fatalf("with a CA that did not sign the upstream: status %d, want 503", got)
	}
	writeCA(srv.Certificate().Raw)
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := status(); got != http.StatusOK {
		t.Fatalf("after the CA file was rewritten and reloaded: status %d, want 200", got)
	}
	writeCA(other)
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := status(); got != http.StatusServiceUnavailable {
		t.Fatalf("after the CA file was rewritten back: status %d, want 503", got)
	}
}

func TestInjectedIdempotencyKeyMakesPostRetryable(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	addr, _ := faultServer(t, func(c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		mu.Lock()
		keys = append(keys, req.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		if n == 1 {
			resetConn(c) // executed, no answer: only a key makes a retry safe
			return
		}
		io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone")
	})
	host, port, _ := net.SplitHostPort(addr)
	px := startProxy(t, Config{Policy: mustPolicy(t, fastRetries+fmt.Sprintf(`
upstreams:
  - host: %s
    port: %s
    honours_idempotency_key: true
    inject_idempotency_key: true
`, host, port))})
	resp, err := px.client().Post("http://"+addr+"/orders", "text/plain", strings.NewReader("one order"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 {
		t.Fatalf("status %d %s=%q", resp.StatusCode, HeaderOutcome, resp.Header.Get(HeaderOutcome))
	}
	checkEgretHeaders(t, resp, "2")
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Fatalf("Idempotency-Key per attempt %q: want the same injected key twice", keys)
	}
}

func TestMetricsCountOutcomes(t *testing.T) {
	m := testMetrics(t)
	var n int
	var mu sync.Mutex
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		k := n
		mu.Unlock()
		if k == 1 {
			w.WriteHeader(503)
		}
	})
	reg := prometheus.NewRegistry()
	rm, err := retry.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, Config{Shared: Shared{Metrics: m, RetryMetrics: rm}, Policy: mustPolicy(t, fastRetries)})
	resp, err := px.client().Get(up.url("/"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp.Body)
	rawRequest(t, px.addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n") // rejected
	waitTrace(px, resp.Header.Get(HeaderRequestID))
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"requests{relayed}", counterValue(t, m.requests.WithLabelValues(labelRelayed)), 1},
		{"requests{rejected}", counterValue(t, m.requests.WithLabelValues(labelRejected)), 1},
		{"attempts", promtest.CounterSum(t, reg, "egret_retry_attempts_total"), 2},
		{"retries{status}", promtest.CounterSum(t, reg, "egret_retry_decisions_total", "decision", "retry", "reason", "status"), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestBearerCredentialRefreshedAfter401(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("old\n"), 0o600)
	var mu sync.Mutex
	var seen []string
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer new" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "welcome")
	})
	host, port, _ := net.SplitHostPort(up.addr)
	p, err := policy.Parse(filepath.Join(dir, "p.yaml"), []byte(fastRetries+fmt.Sprintf(`
upstreams:
  - host: %s
    port: %s
    credential:
      bearer_token_file: %s
      cleartext_addresses: [%s]
`, host, port, tok, host)))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(tok, []byte("new\n"), 0o600) // rotated after egret read it
	px := startProxy(t, Config{Policy: StaticPolicy{p}})
	resp, err := px.client().Get(up.url("/me"))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp.Body); resp.StatusCode != 200 || got != "welcome" {
		t.Fatalf("status %d %q", resp.StatusCode, got)
	}
	checkEgretHeaders(t, resp, "2")
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0] != "Bearer old" || seen[1] != "Bearer new" {
		t.Fatalf("Authorization per attempt %q, want the old token then the refreshed one", seen)
	}
}

// The request duration histogram observes each answered request once, by
// outcome, and the budget gauge reads each upstream's budget at scrape
// time, as a retry would see it.
func TestMetricsDurationAndBudget(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var n sync.Mutex
	first := true
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		n.Lock()
		f := first
		first = false
		n.Unlock()
		if f {
			w.WriteHeader(503)
			return
		}
		time.Sleep(60 * time.Millisecond) // not synchronisation: the duration the histogram must show
		io.WriteString(w, "slow")
	})
	px := startProxy(t, Config{Shared: Shared{Metrics: m}, Policy: mustPolicy(t, fastRetries)})
	if got := gatherMap(t, reg)["egret_proxy_retry_budget_tokens"]; got != nil {
		t.Fatalf("budget series before any request: %v", got)
	}
	resp, err := px.client().Get(up.url("/"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp.Body)
	checkEgretHeaders(t, resp, "2")
	rawRequest(t, px.addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n") // rejected
	var mfs map[string]*dto.MetricFamily
	// Polls: the answer's log line (and observation) follows its last
	// byte, and a registry has no event for a new sample.
	testenv.Poll(5*time.Second, func() bool {
		mfs = gatherMap(t, reg)
		h := histogramOf(mfs["egret_proxy_request_duration_seconds"], "relayed")
		r := histogramOf(mfs["egret_proxy_request_duration_seconds"], "rejected")
		// Both answers observed (the rejected one's too).
		return h != nil && h.GetSampleCount() == 1 && r != nil && r.GetSampleCount() == 1
	})
	h := histogramOf(mfs["egret_proxy_request_duration_seconds"], "relayed")
	if h == nil || h.GetSampleCount() != 1 || h.GetSampleSum() < 0.06 || h.GetSampleSum() > 5 {
		t.Fatalf("relayed duration: %v", h)
	}
	if r := histogramOf(mfs["egret_proxy_request_duration_seconds"], "rejected"); r == nil || r.GetSampleCount() != 1 {
		t.Fatalf("rejected duration: %v", r)
	}
	var want float64
	var upstreams int
	px.cfg.Budgets.Each(func(_ string, b *engine.Budget) { want = b.Tokens(time.Now()); upstreams++ })
	bm := mfs["egret_proxy_retry_budget_tokens"]
	if upstreams != 1 || bm == nil || len(bm.GetMetric()) != 1 {
		t.Fatalf("budget gauge %v for %d upstreams", bm, upstreams)
	}
	g := bm.GetMetric()[0]
	if g.GetLabel()[0].GetValue() != up.addr || g.GetGauge().GetValue() != want || want < 1 {
		t.Fatalf("budget gauge %v, the budget says %v", g, want)
	}
}

func gatherMap(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func histogramOf(mf *dto.MetricFamily, outcome string) *dto.Histogram {
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" && l.GetValue() == outcome {
				return m.GetHistogram()
			}
		}
	}
	return nil
}
