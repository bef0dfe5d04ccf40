package proxy

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/retry"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// upstream is a real HTTP server on loopback that counts what reaches it.
type upstream struct {
	*http.Server
	ln       net.Listener
	addr     string
	requests atomic.Int64
	conns    atomic.Int64
}

func startUpstream(t *testing.T, h http.HandlerFunc) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{ln: ln, addr: ln.Addr().String()}
	u.Server = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u.requests.Add(1)
			h(w, r)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				u.conns.Add(1)
			}
		},
		ErrorLog: nil,
	}
	go u.Serve(ln)
	t.Cleanup(func() { u.Close() })
	return u
}

func (u *upstream) url(path string) string { return "http://" + u.addr + path }

func (u *upstream) addrPort(t *testing.T) netip.AddrPort {
	ap, err := netip.ParseAddrPort(u.addr)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// testProxy is a proxy Server listening on loopback.
type testProxy struct {
	*Server
	addr string
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("EGRET_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}

func startProxy(t *testing.T, cfg Config) *testProxy {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return &testProxy{Server: s, addr: ln.Addr().String()}
}

// client returns an http.Client that uses p as its HTTP proxy.
func (p *testProxy) client() *http.Client {
	pu := &url.URL{Scheme: "http", Host: p.addr}
	return &http.Client{
		Transport: &http.Transport{Proxy: http.ProxyURL(pu), DisableCompression: true},
		Timeout:   10 * time.Second,
	}
}

// rawRequest sends raw bytes on a new connection to addr and reads one
// response.
func rawRequest(t *testing.T, addr, raw string) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	method, _, _ := strings.Cut(raw, " ")
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", firstLine(raw), err)
	}
	if method == http.MethodConnect && resp.StatusCode/100 == 2 {
		return resp // the tunnel is open; nothing ends it
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(strings.NewReader(string(body)))
	return resp
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\r\n")
	return l
}

func readAll(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mustPolicy parses a policy document.
func mustPolicy(t *testing.T, doc string) PolicySource {
	t.Helper()
	p, err := policy.Parse(t.TempDir()+"/policy.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return StaticPolicy{p}
}

// checkEgretHeaders asserts the headers every proxy answer carries.
func checkEgretHeaders(t *testing.T, resp *http.Response, attempts string) {
	t.Helper()
	if id := resp.Header.Get(HeaderRequestID); len(id) != 16 {
		t.Errorf("%s = %q, want a 16-digit id", HeaderRequestID, id)
	}
	if got := resp.Header.Get(HeaderAttempts); got != attempts {
		t.Errorf("%s = %q, want %q", HeaderAttempts, got, attempts)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func addrPortOf(t *testing.T, ln net.Listener) netip.AddrPort {
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func testMetrics(t *testing.T) *Metrics {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

type retryTrace = retry.Trace
type retryAttempt = retry.Attempt
