// Package proxytest sends traffic through a real egret proxy (explicit
// mode; transparent for a passthrough), for tests that look at what the
// traffic leaves behind: metric families, traces, summaries. It is
// imported by tests only.
package proxytest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/retry"
)

// Traffic runs an explicit-mode proxy.Server with pol, pm and rm (fresh
// budgets, bulkheads and traces; logs dropped) on loopback and sends
// through it requests that end every way a request can end: a GET relayed
// at once, a GET relayed after a retry (its first answer a 503), a GET not
// sent (nothing listens) and a POST whose connection the upstream resets
// after reading it (ambiguous). An answer whose Egret-Outcome is not the
// one its ending gives fails t. pol's backoff should be short: the retries
// wait it. Then it passes a connection through (Passthrough).
func Traffic(t testing.TB, pol proxy.PolicySource, pm *proxy.Metrics, rm *retry.Metrics) {
	t.Helper()
	var n atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/flaky":
			if n.Add(1) == 1 {
				rw.WriteHeader(http.StatusServiceUnavailable)
				return
			}
		case "/reset":
			_, _ = io.Copy(io.Discard, r.Body)
			c, _, err := http.NewResponseController(rw).Hijack()
			if err == nil {
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
				c.Close()
			}
			return
		}
		_, _ = io.WriteString(rw, "ok")
	}))
	defer up.Close()
	dead := closedAddr(t).String()

	srv, err := proxy.New(proxy.Config{
		Mode:   proxy.Explicit,
		Policy: pol,
		Shared: proxy.Shared{Budgets: engine.NewBudgets(), Bulkheads: proxy.NewBulkheads(), Metrics: pm, RetryMetrics: rm},
		Traces: proxy.NewTraces(16),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	addr, stop := serve(t, srv)
	defer stop()
	purl, _ := url.Parse("http://" + addr)
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(purl)}}
	defer client.CloseIdleConnections()
	do := func(method, target, wantOutcome string) {
		req, _ := http.NewRequest(method, target, strings.NewReader("pay=1"))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, target, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := resp.Header.Get("Egret-Outcome"); got != wantOutcome {
			t.Errorf("%s %s: Egret-Outcome %q, want %q", method, target, got, wantOutcome)
		}
	}
	do("GET", up.URL+"/ok", "")
	do("GET", up.URL+"/flaky", "")
	do("GET", "http://"+dead+"/", "not-sent")
	do("POST", up.URL+"/reset", "ambiguous")
	Passthrough(t, pm, proxy.Source{})
}

// Passthrough runs a transparent proxy.Server for src's pod with pm
// (logs dropped) whose connections all go to an address nothing listens
// on, and sends it the start of a TLS record: egret passes the connection
// through, its dial is refused and the client is reset. It returns once
// the client saw the reset, by when the flow is counted
// (egret_proxy_passthrough_flows_total: a refused TLS flow of src to
// "other").
func Passthrough(t testing.TB, pm *proxy.Metrics, src proxy.Source) {
	t.Helper()
	dead := closedAddr(t)
	srv, err := proxy.New(proxy.Config{
		Mode:     proxy.Transparent,
		Resolver: &proxy.StaticResolver{Dst: dead},
		Source:   src,
		Shared:   proxy.Shared{Metrics: pm},
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	addr, stop := serve(t, srv)
	defer stop()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(c); err == nil {
		t.Fatal("passthrough to a closed port: the client was not reset")
	}
}

// closedAddr is a loopback address nothing listens on (a port just let
// go): a dial to it is refused.
func closedAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// serve serves srv on a loopback listener; stop shuts it down (up to 5 s).
func serve(t testing.TB, srv *proxy.Server) (addr string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}
