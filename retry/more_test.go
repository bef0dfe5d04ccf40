package retry

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/testkit/promtest"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/retry/client"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

// bodies records the bodies the server received.
type bodies struct {
	mu sync.Mutex
	b  []string
}

func (b *bodies) add(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, s)
	return len(b.b)
}

func (b *bodies) all() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.b...)
}

func TestRetriedBodyIsReplayedWhole(t *testing.T) {
	var got bodies
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if got.add(string(b)) == 1 {
			w.WriteHeader(503)
			return
		}
		io.WriteString(w, "stored")
	}))
	defer srv.Close()
	tr, _, _ := testTransport(t, nil)
	payload := strings.Repeat("0123456789", 10000)
	req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader(payload))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	b := got.all()
	if resp.StatusCode != 200 || len(b) != 2 || b[0] != payload || b[1] != payload {
		t.Fatalf("status %d, %d bodies", resp.StatusCode, len(b))
	}
}

// fileBody is a body spooled to a file that reopens it (like the proxy's).
type fileBody struct {
	*os.File
}

func (fileBody) BodyKind() engine.Body { return engine.BodyReopenable }

func TestReopenableBodyKind(t *testing.T) {
	var got bodies
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if got.add(string(b)) == 1 {
			w.WriteHeader(502)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "spool")
	if err := os.WriteFile(path, []byte("spooled body"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := func() (io.ReadCloser, error) {
		f, err := os.Open(path)
		return fileBody{f}, err
	}
	body, _ := open()
	req, _ := http.NewRequest(http.MethodPut, srv.URL, body)
	req.ContentLength = int64(len("spooled body"))
	req.GetBody = open
	if BodyKind(req) != engine.BodyReopenable {
		t.Fatalf("kind %v", BodyKind(req))
	}
	tr, _, _ := testTransport(t, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	trc, _ := TraceOf(resp)
	b := got.all()
	if resp.StatusCode != 200 || trc.Body != engine.BodyReopenable || len(b) != 2 || b[1] != "spooled body" {
		t.Fatalf("status %d kind %v bodies %q", resp.StatusCode, trc.Body, b)
	}
	// Without GetBody a body that says reopenable cannot keep its word.
	req2, _ := http.NewRequest(http.MethodPut, srv.URL, body)
	if BodyKind(req2) != engine.BodyOneShot {
		t.Fatalf("kind without GetBody %v", BodyKind(req2))
	}
}

func TestUnauthorizedRefreshOnce(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("Authorization") != "Bearer fresh" {
			w.WriteHeader(401)
			return
		}
		io.WriteString(w, "welcome")
	}))
	defer srv.Close()
	var refreshes atomic.Int64
	refresh := func(token string) func(context.Context, *http.Request) error {
		return func(ctx context.Context, r *http.Request) error {
			refreshes.Add(1)
			r.Header.Set("Authorization", "Bearer "+token)
			return nil
		}
	}
	t.Run("fresh token", func(t *testing.T) {
		hits.Store(0)
		refreshes.Store(0)
		tr, _, _ := testTransport(t, func(p *Policy) { p.Refresh = refresh("fresh") })
		req := rawtest.Get(t, srv.URL)
		req.Header.Set("Authorization", "Bearer stale")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || hits.Load() != 2 || refreshes.Load() != 1 {
			t.Fatalf("status %d hits %d refreshes %d", resp.StatusCode, hits.Load(), refreshes.Load())
		}
		if req.Header.Get("Authorization") != "Bearer stale" {
			t.Fatal("the caller's request was modified")
		}
	})
	t.Run("still refused: once only", func(t *testing.T) {
		hits.Store(0)
		refreshes.Store(0)
		tr, _, _ := testTransport(t, func(p *Policy) { p.Refresh = refresh("also-stale"); p.MaxAttempts = 5 })
		resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		trc, _ := TraceOf(resp)
		if resp.StatusCode != 401 || hits.Load() != 2 || refreshes.Load() != 1 ||
			trc.Attempts[1].Decision.Reason != engine.ReasonUnauthorized {
			t.Fatalf("status %d hits %d refreshes %d", resp.StatusCode, hits.Load(), refreshes.Load())
		}
	})
	t.Run("not idempotent: no refresh", func(t *testing.T) {
		hits.Store(0)
		refreshes.Store(0)
		tr, _, _ := testTransport(t, func(p *Policy) { p.Refresh = refresh("fresh") })
		resp, err := tr.RoundTrip(rawtest.Post(t, srv.URL, "x"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 || hits.Load() != 1 || refreshes.Load() != 0 {
			t.Fatalf("status %d hits %d refreshes %d", resp.StatusCode, hits.Load(), refreshes.Load())
		}
	})
}

func TestDrainingDeniesRetries(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(503)
	}))
	defer srv.Close()
	tr, _, _ := testTransport(t, nil)
	tr.Draining = func() bool { return true }
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	trc, _ := TraceOf(resp)
	if hits.Load() != 1 || trc.Attempts[0].Decision.Reason != engine.ReasonRuntimeDraining {
		t.Fatalf("hits %d decision %+v", hits.Load(), trc.Attempts[0].Decision)
	}
}

// TestKeptResponseIsNotReturnedOverAmbiguity: a POST answered 429, then
// sent again and reset after the server read it. Returning the 429 would
// tell the caller it did not run, which may be false.
func TestKeptResponseIsNotReturnedOverAmbiguity(t *testing.T) {
	var executed atomic.Int64
	var n atomic.Int64
	srv := rawtest.NewServer(t, func(c net.Conn, _ int) {
		br := bufio.NewReader(c)
		for {
			if _, _, err := rawtest.ReadReq(br); err != nil {
				return
			}
			if n.Add(1) == 1 {
				io.WriteString(c, "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0\r\nContent-Length: 4\r\n\r\nslow")
				continue
			}
			executed.Add(1)
			rawtest.Reset(c)
			return
		}
	})
	tr, _, _ := testTransport(t, nil)
	_, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "order"))
	var a *AmbiguousError
	if !errors.As(err, &a) || a.Attempts != 2 || executed.Load() != 1 {
		t.Fatalf("err %v executed %d", err, executed.Load())
	}
}

func TestCallerCancelDuringWait(t *testing.T) {
	tr, _, traces := testTransport(t, nil)
	tr.Sleep = nil
	tr.Policy = func(*http.Request) Policy {
		p := DefaultPolicy("")
		p.Backoff = engine.Backoff{Kind: engine.FullJitter, Base: time.Second, Max: time.Second}
		return p
	}
	tr.Rand = constRand{}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := tr.RoundTrip(rawtest.Post(t, closedPort(t), "x").WithContext(ctx))
	if time.Since(start) > 900*time.Millisecond {
		t.Fatalf("the wait did not honour cancellation: %v", time.Since(start))
	}
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, context.Canceled) || e.Outcome != engine.OutcomeNotSent {
		t.Fatalf("err %v", err)
	}
	if len(*traces) != 1 {
		t.Fatalf("OnTrace %d times", len(*traces))
	}
}

// constRand always draws the top of the range.
type constRand struct{}

func (constRand) Int64N(n int64) int64 { return n - 1 }

func TestInvalidRequestNeverDispatched(t *testing.T) {
	tr, _, _ := testTransport(t, nil)
	req := rawtest.Get(t, "http://127.0.0.1:9/")
	req.URL.Scheme = "ftp"
	_, err := tr.RoundTrip(req)
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrRequestInvalid) || e.Trace.Attempts[0].Failure != engine.RequestInvalid {
		t.Fatalf("err %v", err)
	}
}

func TestMetrics(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1)%2 == 1 {
			w.WriteHeader(503)
		}
	}))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	tr, _, _ := testTransport(t, nil)
	tr.Metrics = m
	for range 3 {
		resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if got := promtest.CounterSum(t, reg, "egret_retry_decisions_total", "decision", "retry"); got != 3 {
		t.Fatalf("retry decisions %v", got)
	}
	if got := promtest.CounterSum(t, reg, "egret_retry_outcomes_total", "outcome", "response"); got != 3 {
		t.Fatalf("outcomes %v", got)
	}
	if got := promtest.CounterSum(t, reg, "egret_retry_attempts_total", "category", "none"); got != 6 {
		t.Fatalf("attempts %v", got)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Fatal("registering twice succeeded")
	}
}

// TestErrorsSayEgretOnce: the message of a failure names egret once, in
// one line, whatever its cause (a dial error, an invalid request).
func TestErrorsSayEgretOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	tr, _, _ := testTransport(t, func(p *Policy) { p.MaxAttempts = 1 })
	invalid := rawtest.Get(t, "http://"+closed+"/")
	invalid.URL.Scheme = "ftp"
	for _, req := range []*http.Request{rawtest.Get(t, "http://"+closed+"/"), invalid} {
		_, err := tr.RoundTrip(req)
		if err == nil {
			t.Fatalf("%s: no error", req.URL)
		}
		if msg := err.Error(); strings.Count(msg, "egret:") != 1 || strings.Contains(msg, "\n") {
			t.Errorf("%s: error %q: want \"egret:\" once, one line", req.URL, msg)
		}
	}
}

// TestBodylessWireFormat: the body that stops net/http's own replays must
// not change what goes on the wire, nor cost the connection's reuse.
func TestBodylessWireFormat(t *testing.T) {
	type seen struct {
		method string
		te     []string
		cl     int64
		remote string
	}
	got := make(chan seen, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Method, r.TransferEncoding, r.ContentLength, r.RemoteAddr}
	}))
	defer srv.Close()
	// Both on client.HTTPTransport and on net/http's own Transport as the base
	// (there the body that stops net/http's replays is in play).
	for i, idem := range []engine.Idempotency{{}, {RouteSet: true, Route: false}, {}, {RouteSet: true, Route: false}} {
		tr, _, _ := testTransport(t, func(p *Policy) { p.Idempotency = idem })
		if i >= 2 {
			nh := &http.Transport{}
			t.Cleanup(nh.CloseIdleConnections)
			tr.Base = nh
		}
		remotes := map[string]bool{}
		for _, m := range []string{"GET", "HEAD", "OPTIONS", "DELETE", "GET"} {
			req, _ := http.NewRequest(m, srv.URL, nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			s := <-got
			if s.method != m || len(s.te) != 0 || s.cl != 0 {
				t.Fatalf("%s went out as %s with transfer-encoding %v content-length %d", m, s.method, s.te, s.cl)
			}
			remotes[s.remote] = true
		}
		if len(remotes) != 1 {
			t.Fatalf("%d connections for 5 keep-alive requests", len(remotes))
		}
	}
}

func TestTraceExplain(t *testing.T) {
	var executed atomic.Int64
	srv := resetAfterRead(t, 1, &executed)
	tr, _, _ := testTransport(t, nil)
	_, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "pay"))
	var a *AmbiguousError
	if !errors.As(err, &a) {
		t.Fatal(err)
	}
	out := a.Trace.Explain()
	for _, want := range []string{"POST http://", "not idempotent", "#1 ", "connection_reset", "evidence sent_no_response", "ambiguous (no_response)", "=> ambiguous"} {
		if !strings.Contains(out, want) {
			t.Errorf("explanation lacks %q:\n%s", want, out)
		}
	}
}

// TestWaitingForPooledConnIsPoolTimeout: with the only connection busy, a
// POST that times out waiting for one was never written: not-sent.
func TestWaitingForPooledConnIsPoolTimeout(t *testing.T) {
	release := make(chan struct{})
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		<-release
	}))
	defer srv.Close()
	defer close(release)
	base := client.NewHTTPTransport(client.HTTPOptions{MaxConnsPerHost: 1})
	defer base.CloseIdleConnections()
	busy := &Transport{Base: base}
	started := make(chan struct{})
	go func() {
		req := rawtest.Get(t, srv.URL)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			WroteRequest: func(httptrace.WroteRequestInfo) { close(started) },
		}))
		if resp, err := busy.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-started
	tr, _, _ := testTransport(t, func(p *Policy) { p.AttemptTimeout = 50 * time.Millisecond; p.MaxAttempts = 2 })
	tr.Base = base
	_, err := tr.RoundTrip(rawtest.Post(t, srv.URL, "x"))
	var e *Error
	if !errors.As(err, &e) || e.Outcome != engine.OutcomeNotSent || e.Attempts != 2 {
		t.Fatalf("err %v", err)
	}
	for _, a := range e.Trace.Attempts {
		if a.Failure != engine.PoolTimeout || a.Stage != StagePool {
			t.Fatalf("attempt %+v", a)
		}
	}
	if hits.Load() != 1 {
		t.Fatalf("hits %d", hits.Load())
	}
}

// TestWriteFailureIsNeverNotSentWithoutProof: the server reads the headers
// of a large POST and resets; the body write fails. Without a witness that
// is sent_no_response: ambiguous.
func TestWriteFailureIsNeverNotSentWithoutProof(t *testing.T) {
	srv := rawtest.NewServer(t, func(c net.Conn, _ int) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		rawtest.Reset(c)
	})
	tr, _, _ := testTransport(t, nil)
	_, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), strings.Repeat("x", 8<<20)))
	var a *AmbiguousError
	if !errors.As(err, &a) || a.Attempts != 1 {
		t.Fatalf("err %v", err)
	}
	at := a.Trace.Attempts[0]
	if at.Evidence != engine.SentNoResponse || (at.Failure != engine.WriteFailed && at.Failure != engine.ConnectionReset) {
		t.Fatalf("attempt %+v", at)
	}
}

func TestIPv6Loopback(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		testenv.Require(t, false, "IPv6 loopback: "+err.Error())
	}
	var hits atomic.Int64
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			w.WriteHeader(503)
		}
	})}}
	srv.Start()
	defer srv.Close()
	var upstream string
	tr, _, _ := testTransport(t, nil)
	tr.OnTrace = func(tc *Trace) { upstream = tc.Upstream }
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || hits.Load() != 2 || upstream != ln.Addr().String() {
		t.Fatalf("status %d hits %d upstream %q", resp.StatusCode, hits.Load(), upstream)
	}
}

func TestUpgradeKeepsConnectionWritable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		line, _ := brw.ReadString('\n')
		io.WriteString(c, "echo: "+line)
	}))
	defer srv.Close()
	tr, _, _ := testTransport(t, nil)
	req := rawtest.Get(t, srv.URL)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if resp.StatusCode != 101 || !ok {
		t.Fatalf("status %d, writable %v", resp.StatusCode, ok)
	}
	io.WriteString(rw, "hello\n")
	line, err := bufio.NewReader(rw).ReadString('\n')
	if err != nil || line != "echo: hello\n" {
		t.Fatalf("read %q %v", line, err)
	}
	if _, ok := TraceOf(resp); !ok {
		t.Fatal("no trace")
	}
}

// TestBudgetIsSharedAcrossTransports: two Transports (two pods' proxies on
// one node) with one Budgets registry retry within one budget.
func TestBudgetIsSharedAcrossTransports(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(503)
	}))
	defer srv.Close()
	cfg := engine.BudgetConfig{Ratio: 0.1, MinPerSecond: 0.5, TTL: 10 * time.Second}
	shared := engine.NewBudgets()
	var trs []*Transport
	for range 2 {
		tr, _, _ := testTransport(t, func(p *Policy) { p.Budget = cfg; p.Upstream = "api:80" })
		tr.Budgets = shared
		trs = append(trs, tr)
	}
	const originals = 100
	for i := range originals {
		resp, err := trs[i%2].RoundTrip(rawtest.Get(t, srv.URL))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	retries := float64(hits.Load() - originals)
	if bound := cfg.Ratio*originals + cfg.MinPerSecond*cfg.TTL.Seconds(); retries > bound || retries < 1 {
		t.Fatalf("%v retries through two Transports, shared bound %v", retries, bound)
	}
}

// TestExplainBudgetOnlyWhenConsulted: a retried 503 shows the budget its
// decision read; the 200 after it never consults the budget and says
// nothing of it.
func TestExplainBudgetOnlyWhenConsulted(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	tr, _, _ := testTransport(t, nil)
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	trc, _ := TraceOf(resp)
	if len(trc.Attempts) != 2 || !trc.Attempts[0].BudgetRead || trc.Attempts[1].BudgetRead {
		t.Fatalf("attempts %+v", trc.Attempts)
	}
	lines := strings.Split(trc.Explain(), "\n")
	if !strings.Contains(lines[1], "status 503") || !strings.Contains(lines[1], ", budget ") ||
		!strings.Contains(lines[2], "status 200") || strings.Contains(lines[2], "budget") {
		t.Fatalf("explanation:\n%s", trc.Explain())
	}
}
