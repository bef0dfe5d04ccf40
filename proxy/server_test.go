package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

func TestExplicitGetAndPost(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Method", r.Method)
		fmt.Fprintf(w, "%s %s body=%s", r.Method, r.URL.RequestURI(), b)
	})
	p := startProxy(t, Config{})
	c := p.client()

	resp, err := c.Get(up.url("/a?b=1"))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp.Body); got != "GET /a?b=1 body=" {
		t.Errorf("GET body %q", got)
	}
	checkEgretHeaders(t, resp, "1")
	if resp.Header.Get(HeaderOutcome) != "" {
		t.Errorf("a relayed 200 carries %s %q", HeaderOutcome, resp.Header.Get(HeaderOutcome))
	}

	resp, err = c.Post(up.url("/orders"), "text/plain", strings.NewReader("pay 5"))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp.Body); got != "POST /orders body=pay 5" {
		t.Errorf("POST body %q", got)
	}
	checkEgretHeaders(t, resp, "1")
	if n := up.requests.Load(); n != 2 {
		t.Errorf("upstream saw %d requests, want 2", n)
	}
}

func TestKeepAliveReuse(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	p := startProxy(t, Config{})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	ids := map[string]bool{}
	for i := range 5 {
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", up.url(fmt.Sprintf("/%d", i)), up.addr)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the same connection: %v", i, err)
		}
		if b := readAll(t, resp.Body); b != "ok" {
			t.Fatalf("request %d: body %q", i, b)
		}
		ids[resp.Header.Get(HeaderRequestID)] = true
	}
	if len(ids) != 5 {
		t.Errorf("%d distinct request ids for 5 requests", len(ids))
	}
	if n := up.conns.Load(); n != 1 {
		t.Errorf("upstream saw %d connections for 5 sequential requests, want 1 (pooled)", n)
	}
}

func TestConnectTunnel(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "secret")
	}))
	defer srv.Close()
	p := startProxy(t, Config{Bounds: Bounds{ConnectPorts: []int{srv.Listener.Addr().(*net.TCPAddr).Port}}})
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.Proxy = http.ProxyURL(mustURL(t, "http://"+p.addr))
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(srv.URL + "/x")
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp.Body); got != "secret" {
		t.Fatalf("through the tunnel: %q", got)
	}
}

func TestTransparentHTTP(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "host=%s uri=%s", r.Host, r.URL.RequestURI())
	})
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: up.addrPort(t)}})
	resp := rawRequest(t, p.addr, "GET /v1/x?y=2 HTTP/1.1\r\nHost: api.example\r\n\r\n")
	if got := readAll(t, resp.Body); got != "host=api.example uri=/v1/x?y=2" {
		t.Fatalf("upstream saw %q", got)
	}
	checkEgretHeaders(t, resp, "1")
}

// echoServer accepts one connection and echoes what it reads, prefixed.
func echoServer(t *testing.T, greeting string) (net.Listener, chan []byte) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if greeting != "" {
			io.WriteString(c, greeting)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4096)
		n, _ := c.Read(buf)
		got <- append([]byte(nil), buf[:n]...)
		c.Write(append([]byte("echo:"), buf[:n]...))
	}()
	return ln, got
}

// A TLS ClientHello, sent at once or after the sniff timeout, is passed
// through byte for byte and counted as tls.
func TestTransparentPassthroughTLS(t *testing.T) {
	for _, silence := range []time.Duration{0, 200 * time.Millisecond} {
		ln, got := echoServer(t, "")
		m := testMetrics(t)
		p := startProxy(t, Config{
			Mode:     Transparent,
			Resolver: &StaticResolver{Dst: addrPortOf(t, ln)},
			Shared:   Shared{Metrics: m},
			Timeouts: Timeouts{SniffTimeout: 50 * time.Millisecond},
		})
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		time.Sleep(silence) // not synchronisation: the client's silence under test
		// A real ClientHello from crypto/tls, captured on the way.
		hello := captureClientHello(t)
		c.Write(hello)
		select {
		case b := <-got:
			if !bytes.Equal(b, hello) {
				t.Fatalf("silent %v: destination got %d bytes, want the %d-byte ClientHello unchanged", silence, len(b), len(hello))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("silent %v: nothing reached the destination", silence)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		back := make([]byte, 5)
		if _, err := io.ReadFull(c, back); err != nil || string(back) != "echo:" {
			t.Fatalf("silent %v: reply %q, %v", silence, back, err)
		}
		if n := counterValue(t, m.passthrough.WithLabelValues("tls")); n != 1 {
			t.Errorf("silent %v: passthrough{tls} = %v, want 1", silence, n)
		}
		if v := counterValue(t, m.lateHTTPs); v != 0 {
			t.Errorf("silent %v: late HTTP connections %v, want 0", silence, v)
		}
	}
}

// A destination that speaks first is passed through as server_first, its
// greeting and the client's answer byte for byte; also when it speaks only
// after the sniff timeout, to a client that then writes HTTP-looking text
// (the destination spoke first: no late HTTP).
func TestTransparentPassthroughServerFirst(t *testing.T) {
	for _, c := range []struct {
		name, greeting, reply string
		sniff                 time.Duration
	}{
		{"smtp", "220 smtp ready\r\n", "EHLO me\r\n", 100 * time.Millisecond},
		{"http-looking reply", "220 ready\r\n", "HELP ME\r\n", 50 * time.Millisecond}, // a method and a space
	} {
		t.Run(c.name, func(t *testing.T) {
			ln, got := echoServer(t, c.greeting)
			m := testMetrics(t)
			p := startProxy(t, Config{
				Mode:     Transparent,
				Resolver: &StaticResolver{Dst: addrPortOf(t, ln)},
				Shared:   Shared{Metrics: m},
				Timeouts: Timeouts{SniffTimeout: c.sniff},
			})
			cn, err := net.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer cn.Close()
			cn.SetReadDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(cn)
			if line, err := br.ReadString('\n'); err != nil || line != c.greeting {
				t.Fatalf("greeting %q, %v", line, err)
			}
			io.WriteString(cn, c.reply)
			if b := <-got; string(b) != c.reply {
				t.Fatalf("server got %q", b)
			}
			if n := counterValue(t, m.passthrough.WithLabelValues(string(ProtoSilent))); n != 1 {
				t.Errorf("passthrough{server_first} = %v, want 1", n)
			}
			if v := counterValue(t, m.lateHTTPs); v != 0 {
				t.Errorf("late HTTP connections %v, want 0", v)
			}
		})
	}
}

func TestHopByHopRemoved(t *testing.T) {
	seen := make(chan http.Header, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Hop", "secret")
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-End", "kept")
		io.WriteString(w, "ok")
	})
	p := startProxy(t, Config{})
	resp := rawRequest(t, p.addr, "GET "+up.url("/")+" HTTP/1.1\r\nHost: "+up.addr+"\r\n"+
		"Connection: keep-alive, X-Private\r\nX-Private: 1\r\nKeep-Alive: 300\r\nProxy-Authorization: Basic eA==\r\n"+
		"TE: trailers\r\nUpgrade-Insecure-Requests: 1\r\nX-Kept: yes\r\n"+HeaderTimeoutMs+": 5000\r\n\r\n")
	h := <-seen
	for _, k := range []string{"X-Private", "Keep-Alive", "Proxy-Authorization", "Te", HeaderTimeoutMs} {
		if v, ok := h[k]; ok {
			t.Errorf("upstream received hop-by-hop %s: %q", k, v)
		}
	}
	if h.Get("X-Kept") != "yes" || h.Get("Upgrade-Insecure-Requests") != "1" {
		t.Errorf("end-to-end headers lost: %v", h)
	}
	for _, k := range []string{"X-Hop", "Keep-Alive"} {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("client received hop-by-hop %s: %q", k, v)
		}
	}
	if resp.Header.Get("X-End") != "kept" {
		t.Errorf("end-to-end response header lost")
	}
}

func TestMalformedRequestsNeverReachUpstream(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached") })
	p := startProxy(t, Config{Bounds: Bounds{MaxHeaderBytes: 4096, MaxHeaderCount: 20}})
	target := up.url("/")
	many := strings.Repeat("X-A: 1\r\n", 21)
	cases := []struct {
		name, raw string
		status    int
	}{
		{"CL+TE", "POST " + target + " HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"TE+CL lower case", "POST " + target + " HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n0\r\n\r\n", 400},
		{"too many headers", "GET " + target + " HTTP/1.1\r\nHost: x\r\n" + many + "\r\n", 431},
		{"header too large", "GET " + target + " HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 5000) + "\r\n\r\n", 431},
		{"request line too long", "GET " + target + strings.Repeat("a", 5000) + " HTTP/1.1\r\nHost: x\r\n\r\n", 414},
		{"two content lengths", "POST " + target + " HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc", 400},
		{"bad content length", "POST " + target + " HTTP/1.1\r\nHost: x\r\nContent-Length: -3\r\n\r\nabc", 400},
		{"unknown coding", "POST " + target + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
		{"origin-form to an explicit proxy", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"bad header name", "GET " + target + " HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n", 400},
		{"HTTP/2 version", "GET " + target + " HTTP/2.0\r\nHost: x\r\n\r\n", 505},
		{"bad timeout", "GET " + target + " HTTP/1.1\r\nHost: x\r\n" + HeaderTimeoutMs + ": soon\r\n\r\n", 400},
		{"expect other", "PUT " + target + " HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 200-ok\r\n\r\nx", 417},
		{"bad chunk", "POST " + target + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", 400},
	}
	for _, c := range cases {
		resp := rawRequest(t, p.addr, c.raw)
		if resp.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d", c.name, resp.StatusCode, c.status)
		}
		checkEgretHeaders(t, resp, "0")
	}
	if n := up.requests.Load(); n != 0 {
		t.Errorf("upstream reached %d times by malformed requests", n)
	}
}

func TestSlowClientHeaderTimeout(t *testing.T) {
	p := startProxy(t, Config{Timeouts: Timeouts{ReadHeaderTimeout: 150 * time.Millisecond}})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: x\r\n") // never ends
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d, want 408", resp.StatusCode)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("answered after %v", d)
	}
}

func TestIdleTimeoutClosesConnection(t *testing.T) {
	p := startProxy(t, Config{Timeouts: Timeouts{IdleTimeout: 100 * time.Millisecond}})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection: read %v, want EOF from the proxy closing it", err)
	}
}

// captureClientHello returns the first bytes crypto/tls sends.
func captureClientHello(t *testing.T) []byte {
	a, b := net.Pipe()
	go func() {
		tc := tls.Client(a, &tls.Config{ServerName: "example.com"})
		tc.SetDeadline(time.Now().Add(2 * time.Second))
		tc.Handshake()
		a.Close()
	}()
	buf := make([]byte, 4096)
	b.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := b.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	return buf[:n]
}

func TestViaAddedAndLoopRefused(t *testing.T) {
	seen := make(chan string, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { seen <- r.Header.Get("Via") })
	p := startProxy(t, Config{Shared: Shared{Via: "egret"}})
	resp := rawRequest(t, p.addr, "GET "+up.url("/")+" HTTP/1.1\r\nHost: x\r\nVia: 1.1 corp-proxy\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if v := <-seen; v != "1.1 corp-proxy, 1.1 egret" && v != "1.1 corp-proxy" {
		t.Fatalf("upstream Via %q", v)
	}
	// A request that already went through this proxy is refused.
	resp = rawRequest(t, p.addr, "GET "+up.url("/")+" HTTP/1.1\r\nHost: x\r\nVia: 1.1 corp, 1.1 egret\r\n\r\n")
	if resp.StatusCode != http.StatusLoopDetected {
		t.Fatalf("request with our Via: status %d, want 508", resp.StatusCode)
	}
	// A request to the proxy's own address is refused before egret dials
	// itself, instead of chaining connections.
	resp = rawRequest(t, p.addr, "GET http://"+p.addr+"/ HTTP/1.1\r\nHost: "+p.addr+"\r\n\r\n")
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get(HeaderAttempts) != "0" {
		t.Fatalf("request to itself: status %d attempts %q, want 403 before any attempt", resp.StatusCode, resp.Header.Get(HeaderAttempts))
	}
}

func TestPipelinedRequests(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.URL.Path) })
	p := startProxy(t, Config{})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var all strings.Builder
	for _, path := range []string{"/one", "/two", "/three"} {
		fmt.Fprintf(&all, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", up.url(path))
	}
	io.WriteString(c, all.String()) // all three in one write
	br := bufio.NewReader(c)
	for _, want := range []string{"/one", "/two", "/three"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, resp.Body); got != want {
			t.Fatalf("answer %q, want %q (in order)", got, want)
		}
	}
}

func TestResponseFraming(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Len", "11")
		if r.URL.Path == "/stream" {
			io.WriteString(w, "part1,")
			w.(http.Flusher).Flush() // unknown length: chunked from the upstream
			io.WriteString(w, "part2")
			return
		}
		w.Header().Set("Content-Length", "11")
		io.WriteString(w, "hello world")
	})
	p := startProxy(t, Config{})
	// HEAD: the length of the GET, no body, connection reusable.
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	fmt.Fprintf(c, "HEAD %s HTTP/1.1\r\nHost: x\r\n\r\n", up.url("/"))
	resp, err := http.ReadResponse(br, &http.Request{Method: "HEAD"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.ContentLength != 11 {
		t.Errorf("HEAD Content-Length %d, want 11", resp.ContentLength)
	}
	// Chunked to an HTTP/1.1 client when the length is unknown.
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", up.url("/stream"))
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Errorf("unknown length relayed with %v", resp.TransferEncoding)
	}
	if got := readAll(t, resp.Body); got != "part1,part2" {
		t.Errorf("body %q", got)
	}
	// HTTP/1.0: the end of the body is the end of the connection.
	resp = rawRequest(t, p.addr, "GET "+up.url("/stream")+" HTTP/1.0\r\n\r\n")
	if got := readAll(t, resp.Body); got != "part1,part2" || !resp.Close {
		t.Errorf("HTTP/1.0: body %q close %v", got, resp.Close)
	}
}

func TestUpstreamCannotForgeEgretHeaders(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderOutcome, "not-sent")
		w.Header().Set(HeaderAttempts, "7")
		w.Header().Set(HeaderRequestID, "forged")
		io.WriteString(w, "ok")
	})
	p := startProxy(t, Config{})
	resp, err := p.client().Post(up.url("/"), "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	if v := resp.Header.Values(HeaderOutcome); len(v) != 0 {
		t.Errorf("relayed 200 carries the upstream's %s %q", HeaderOutcome, v)
	}
	checkEgretHeaders(t, resp, "1")
}

// A client that connects and stays silent past the sniff timeout, then
// sends an HTTP/1.x request before the destination said anything (a pool
// that connects ahead), is served as HTTP, retries and all; the connection
// dialed in case the destination spoke first is closed unused.
func TestTransparentLateHTTPIsServed(t *testing.T) {
	var n atomic.Int64
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "late but served")
	})
	m := testMetrics(t)
	p := startProxy(t, Config{
		Mode:     Transparent,
		Resolver: &StaticResolver{Dst: up.addrPort(t)},
		Shared:   Shared{Metrics: m},
		Timeouts: Timeouts{SniffTimeout: 50 * time.Millisecond},
		Policy:   mustPolicy(t, fastRetries),
	})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Past the sniff timeout, and until the dial for the silent case is
	// done. Polls: the upstream's accept count is the only sign of it.
	testenv.Eventually(t, 5*time.Second, "the destination dialed for the silent connection", func() bool { return up.conns.Load() >= 1 })
	// Not synchronisation: the request comes late, a while into the wait
	// for either side to speak that follows the dial; it must be served
	// wherever in that wait it lands.
	time.Sleep(100 * time.Millisecond)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /late HTTP/1.1\r\nHost: %s\r\n\r\n", up.addr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp.Body)
	if resp.StatusCode != 200 || body != "late but served" || resp.Header.Get(HeaderRequestID) == "" {
		t.Fatalf("answer %d %q %v", resp.StatusCode, body, resp.Header)
	}
	checkEgretHeaders(t, resp, "2")
	if got := up.requests.Load(); got != 2 {
		t.Errorf("upstream executed %d requests, want 2", got)
	}
	if v := counterValue(t, m.lateHTTPs); v != 1 {
		t.Errorf("late HTTP connections %v, want 1", v)
	}
	if v := counterValue(t, m.passthrough.WithLabelValues(string(ProtoSilent))); v != 0 {
		t.Errorf("passthrough{server_first} = %v, want 0", v)
	}
}
