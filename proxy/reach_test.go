package proxy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// Explicit mode's reach (SECURITY.md): what a client of `egret proxy` may
// connect to through it. Real listeners count every connection they get.

// TestConnectReach: CONNECT reaches allowed ports only, never egret's own
// listener or metrics address, nor a denied address; each refusal is a
// 403 before any connection to the target.
func TestConnectReach(t *testing.T) {
	allowed := listenWire(t, "127.0.0.1:0")
	go func() { // an echo server on an allowed port
		for {
			c, err := allowed.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { allowed.Close() })
	other := listenWire(t, "127.0.0.1:0") // a port not allowed
	t.Cleanup(func() { other.Close() })
	metrics := listenWire(t, "127.0.0.1:0") // egret's metrics address
	t.Cleanup(func() { metrics.Close() })
	denied := listenWire(t, "127.0.0.3:0") // an address the policy denies
	t.Cleanup(func() { denied.Close() })
	pol := mustPolicy(t, "deny_destinations: [127.0.0.3/32, 169.254.0.0/16]\n")
	// egret's own port is allowed too: only the loop check stands in the
	// way of a CONNECT to itself.
	self := listenWire(t, "127.0.0.1:0")
	srv, err := New(Config{
		Policy: pol,
		Bounds: Bounds{Protect: []string{metrics.Addr().String()}, ConnectPorts: []int{int(allowed.addrPort().Port()), 443, int(metrics.addrPort().Port()),
			int(denied.addrPort().Port()), int(self.addrPort().Port())}},
		Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(self)
	t.Cleanup(func() { srv.Shutdown(t.Context()) })
	p := &testProxy{Server: srv, addr: self.Addr().String()}
	for _, tc := range []struct {
		name, target string
		status       int
		l            *wire
	}{
		{"port not allowed", other.Addr().String(), 403, other},
		{"metrics address", metrics.Addr().String(), 403, metrics},
		{"metrics by name", "localhost:" + fmt.Sprint(metrics.addrPort().Port()), 403, metrics},
		{"denied address", denied.Addr().String(), 403, denied},
		{"metadata address", "169.254.169.254:443", 403, nil},
		{"egret itself (a loop)", p.addr, 403, nil},
		{"egret itself by name (a loop)", "localhost:" + fmt.Sprint(self.addrPort().Port()), 403, nil},
	} {
		before := int64(0)
		if tc.l != nil {
			before = tc.l.conns.Load()
		}
		resp := rawRequest(t, p.addr, "CONNECT "+tc.target+" HTTP/1.1\r\nHost: "+tc.target+"\r\n\r\n")
		if resp.StatusCode != tc.status {
			t.Errorf("%s: CONNECT %s: status %d, want %d", tc.name, tc.target, resp.StatusCode, tc.status)
		}
		if tc.l != nil && tc.status != 200 && tc.l.conns.Load() != before {
			t.Errorf("%s: the target got a connection", tc.name)
		}
	}
	// Each CONNECT above was one connection to egret: none chained.
	if n := self.conns.Load(); n != 7 {
		t.Errorf("egret accepted %d connections for 7 CONNECTs: a loop", n)
	}
	// An allowed port: the tunnel carries bytes both ways.
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\nping", allowed.Addr())
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT to an allowed port: %v %v", resp, err)
	}
	echo := make([]byte, 4)
	if _, err := io.ReadFull(br, echo); err != nil || string(echo) != "ping" {
		t.Fatalf("through the tunnel: %q %v", echo, err)
	}
}

// TestRequestReach: an absolute-form request to a denied address (given as
// an address, or a name that resolves to it) or to egret's own addresses
// is refused, and the target never gets a connection.
func TestRequestReach(t *testing.T) {
	target := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached") })
	port := target.addrPort(t).Port()
	metrics := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "metrics") })
	// localhost is 127.0.0.1 (and ::1, where nothing listens): a name
	// that resolves to a denied address.
	pol := mustPolicy(t, "deny_destinations: [127.0.0.1/32]\n")
	p := startProxy(t, Config{Policy: pol})
	for _, u := range []string{target.url("/"), fmt.Sprintf("http://localhost:%d/", port)} {
		resp := rawRequest(t, p.addr, "GET "+u+" HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp.StatusCode == 200 {
			t.Errorf("GET %s through egret: 200", u)
		}
	}
	if n := target.conns.Load(); n != 0 {
		t.Fatalf("the denied address got %d connections", n)
	}
	// The default list: metadata endpoints, refused before any attempt.
	def := startProxy(t, Config{Bounds: Bounds{Protect: []string{metrics.addr}}})
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/iam/security-credentials/", "http://[fd00:ec2::254]/latest/", metrics.url("/metrics"), "http://" + def.addr + "/"} {
		resp := rawRequest(t, def.addr, "GET "+u+" HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp.StatusCode != 403 || resp.Header.Get(HeaderAttempts) != "0" {
			t.Errorf("GET %s: status %d attempts %s, want 403 before any attempt", u, resp.StatusCode, resp.Header.Get(HeaderAttempts))
		}
	}
	if n := metrics.conns.Load(); n != 0 {
		t.Errorf("egret's metrics address got %d connections", n)
	}
	// An empty list turns the default off.
	open := startProxy(t, Config{Policy: mustPolicy(t, "deny_destinations: []\n")})
	if resp := rawRequest(t, open.addr, "GET "+target.url("/")+" HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
		t.Errorf("with deny_destinations: [] : status %d", resp.StatusCode)
	}
}

// TestTunnelIdleTimeout: a tunnel silent both ways is closed after the
// idle timeout; one that carries bytes one way only stays open.
func TestTunnelIdleTimeout(t *testing.T) {
	ln := listenWire(t, "127.0.0.1:0")
	t.Cleanup(func() { ln.Close() })
	stream := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 1)
				if _, err := c.Read(b); err != nil || b[0] != 's' {
					io.Copy(io.Discard, c) // silent: waits for the end
					return
				}
				// A one-way stream: a byte every 100 ms for 1.5 s, past
				// the idle timeout of 1 s. (A byte every 40 ms under a
				// timeout of 200 ms failed under -count=3 and CPU load:
				// the first byte came more than 200 ms after the 's'.)
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for range 15 {
					<-tick.C
					if _, err := c.Write([]byte("x")); err != nil {
						return
					}
				}
				close(stream)
			}()
		}
	}()
	const idle = time.Second
	p := startProxy(t, Config{Timeouts: Timeouts{TunnelIdleTimeout: idle}, Bounds: Bounds{ConnectPorts: []int{int(ln.addrPort().Port())}}})
	open := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n", ln.Addr())
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		return c, br
	}
	c, br := open()
	start := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("a silent tunnel: read %v, want EOF when egret closes it", err)
	}
	// The clock starts when egret opens the tunnel, a moment before the
	// client reads its 200.
	if d := time.Since(start); d < idle-20*time.Millisecond || d > idle+3*time.Second {
		t.Fatalf("a silent tunnel closed after %v, idle timeout %v", d, idle)
	}
	c.Close()
	c, br = open()
	c.Write([]byte("s"))
	got, err := io.ReadAll(br)
	if len(got) != 15 {
		t.Fatalf("a one-way stream of 1.5 s under an idle timeout of %v: got %d of 15 bytes (%v)", idle, len(got), err)
	}
	<-stream
}

// TestUpgradeHygiene: an Upgrade request goes upstream with the same
// hygiene as any other: Proxy-Authorization, Keep-Alive and the fields
// Connection names removed, a folded field joined, Via added; only
// Connection: Upgrade and Upgrade are kept for the switch.
func TestUpgradeHygiene(t *testing.T) {
	ln := listenWire(t, "127.0.0.1:0")
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			l, err := br.ReadString('\n')
			if err != nil || l == "\r\n" {
				break
			}
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		io.Copy(io.Discard, br)
	}()
	p := startProxy(t, Config{Shared: Shared{Via: "egret"}, Bounds: Bounds{ConnectPorts: []int{int(ln.addrPort().Port())}}})
	raw := "GET " + "http://" + ln.Addr().String() + "/ws HTTP/1.1\r\nHost: " + ln.Addr().String() + "\r\n" +
		"Connection: Upgrade, X-Hop\r\nUpgrade: websocket\r\nProxy-Authorization: Basic c2VjcmV0\r\n" +
		"Keep-Alive: timeout=5\r\nX-Hop: drop-me\r\nX-Kept: a b\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, raw)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	head := string(ln.bytes())
	for _, bad := range []string{"Proxy-Authorization", "c2VjcmV0", "Keep-Alive", "X-Hop"} {
		if strings.Contains(head, bad) {
			t.Errorf("upstream got %q:\n%s", bad, head)
		}
	}
	for _, want := range []string{"GET /ws HTTP/1.1\r\n", "Connection: Upgrade\r\n", "Upgrade: websocket\r\n", "X-Kept: a b\r\n", "Via: 1.1 egret\r\n", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"} {
		if !strings.Contains(head, want) {
			t.Errorf("upstream lacks %q:\n%s", want, head)
		}
	}
}

// TestForwardProxyPod: in transparent mode a pod's own forward proxy keeps
// its protocol: HTTPS through CONNECT works, and an absolute-form request
// reaches the forward proxy in absolute form (an egret in explicit mode
// here, which refuses any other form), both carried as the pod sent them.
func TestForwardProxyPod(t *testing.T) {
	origin := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "through my proxy") }))
	defer origin.Close()
	plain := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "plain "+r.URL.Path) })
	fwdLog := &lineBuffer{lines: make(chan struct{}, 16)}
	fwd := startProxy(t, Config{
		Logger: slog.New(slog.NewTextHandler(fwdLog, nil)),
		Bounds: Bounds{ConnectPorts: []int{origin.Listener.Addr().(*net.TCPAddr).Port}},
	})
	res := &StaticResolver{Dst: netip.MustParseAddrPort(fwd.addr)}
	m := testMetrics(t)
	pod := startProxy(t, Config{Mode: Transparent, Resolver: res, Shared: Shared{Metrics: m}})
	// The pod's HTTPS_PROXY is the forward proxy; its connects to it come
	// to egret (here: to egret's listener, with the forward proxy as the
	// original destination).
	tr := origin.Client().Transport.(*http.Transport).Clone()
	tr.Proxy = http.ProxyURL(mustURL(t, "http://"+pod.addr))
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := client.Get(origin.URL + "/secret")
	if err != nil {
		t.Fatalf("HTTPS through the pod's own CONNECT proxy: %v", err)
	}
	if got := readAll(t, resp.Body); got != "through my proxy" {
		t.Fatalf("HTTPS through the pod's proxy: %q", got)
	}
	resp, err = client.Get(plain.url("/abs"))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp.Body); resp.StatusCode != 200 || got != "plain /abs" {
		t.Fatalf("absolute-form through the pod's proxy: %d %q", resp.StatusCode, got)
	}
	tr.CloseIdleConnections()
	for range 2 { // the forward proxy's lines: the CONNECT, the GET
		select {
		case <-fwdLog.lines:
		case <-time.After(5 * time.Second):
			t.Fatalf("the forward proxy logged:\n%s", fwdLog.String())
		}
	}
	logs := fwdLog.String()
	if !strings.Contains(logs, "method=CONNECT url="+origin.Listener.Addr().String()) || !strings.Contains(logs, "method=GET url="+plain.url("/abs")) {
		t.Fatalf("the forward proxy did not see the pod's own requests:\n%s", logs)
	}
	if v := counterValue(t, m.passthrough.WithLabelValues(string(ProtoForwardProxy))); v != 2 {
		t.Errorf("forward_proxy passthroughs %v, want 2", v)
	}
}

// TestLogsDropQuery: tokens in query strings reach neither log lines nor
// traces, whatever the answer (relayed, failed, refused); --log-query
// keeps them.
func TestLogsDropQuery(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	dead := freePort(t)
	const secret = "sig-5ec7e7-do-not-log"
	for _, keep := range []bool{false, true} {
		out := &lineBuffer{lines: make(chan struct{}, 16)}
		p := startProxy(t, Config{Logger: slog.New(slog.NewTextHandler(out, nil)), Shared: Shared{LogQuery: keep}})
		ids := []string{}
		for _, raw := range []string{
			"GET " + up.url("/x?token="+secret) + " HTTP/1.1\r\nHost: x\r\n\r\n",
			"GET http://user:" + secret + "@" + up.addr + "/y HTTP/1.1\r\nHost: x\r\n\r\n",
			fmt.Sprintf("GET http://127.0.0.1:%d/z?token=%s HTTP/1.1\r\nHost: x\r\n\r\n", dead, secret),
			"GET http://169.254.169.254/w?token=" + secret + " HTTP/1.1\r\nHost: x\r\n\r\n",
		} {
			resp := rawRequest(t, p.addr, raw)
			ids = append(ids, resp.Header.Get(HeaderRequestID))
		}
		for range 4 { // each request's line is written after its answer
			select {
			case <-out.lines:
			case <-time.After(5 * time.Second):
				t.Fatalf("4 log lines not written:\n%s", out.String())
			}
		}
		logs := out.String()
		traced := ""
		for _, id := range ids[:3] {
			if tr, ok := waitTrace(p, id); ok {
				traced += tr.URL + "\n"
			}
		}
		n := strings.Count(logs, secret) + strings.Count(traced, secret)
		if !keep && n != 0 {
			t.Fatalf("the query's token is in the logs or traces:\n%s%s", logs, traced)
		}
		if keep && (!strings.Contains(logs, "token="+secret) || strings.Contains(logs, "user:"+secret)) {
			t.Fatalf("LogQuery: the query should be kept and the password dropped:\n%s", logs)
		}
	}
}

// lineBuffer keeps what a logger writes and signals each write (one line
// each, as slog writes them).
type lineBuffer struct {
	lockedBuffer
	lines chan struct{}
}

func (b *lineBuffer) Write(p []byte) (int, error) {
	n, err := b.lockedBuffer.Write(p)
	b.lines <- struct{}{}
	return n, err
}
