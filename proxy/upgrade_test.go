package proxy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// The Upgrade path (issue 22, findings 2-4): an Upgrade request is HTTP
// until the upstream answers it 101; only then, and only to where a tunnel
// may go, is the connection piped. Each test runs egret's real server
// between a raw client socket and a real upstream.

// seen is what an upstream was asked, one line per request: method, path
// and body.
type seen struct {
	mu   sync.Mutex
	reqs []string
}

func (s *seen) add(r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.reqs = append(s.reqs, fmt.Sprintf("%s %s %q", r.Method, r.URL.Path, b))
	s.mu.Unlock()
}

func (s *seen) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reqs...)
}

// upgradeModes runs f in explicit mode (the upstream's port allowed for
// tunnels) and transparent mode, against the upstream at addr: cfg is the
// proxy's Config and target the request target to use.
func upgradeModes(t *testing.T, addr string, f func(t *testing.T, cfg Config, target func(path string) string)) {
	ap := mustAddrPort(t, addr)
	for _, mode := range []Mode{Explicit, Transparent} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := Config{Mode: mode, Bounds: Bounds{ConnectPorts: []int{int(ap.Port())}}}
			target := func(path string) string { return "http://" + addr + path }
			if mode == Transparent {
				cfg.Resolver = &StaticResolver{Dst: ap}
				target = func(path string) string { return path }
			}
			f(t, cfg, target)
		})
	}
}

func dialProxy(t *testing.T, p *testProxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

func readUpAnswer(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestUpgradeRefusedKeepsParsing (finding 2): an Upgrade request the
// upstream does not switch for is an ordinary request, and what follows it
// on the connection is parsed as HTTP: a pipelined request with both
// Content-Length and Transfer-Encoding gets egret's 400, logged, and never
// reaches the upstream.
func TestUpgradeRefusedKeepsParsing(t *testing.T) {
	var s seen
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		s.add(r)
		io.WriteString(w, "no switch")
	})
	upgradeModes(t, up.addr, func(t *testing.T, cfg Config, target func(string) string) {
		s = seen{}
		log := &lockedBuffer{}
		cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
		p := startProxy(t, cfg)
		c, br := dialProxy(t, p)
		io.WriteString(c, "GET "+target("/ws")+" HTTP/1.1\r\nHost: ws.example\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"+
			"POST "+target("/smuggled")+" HTTP/1.1\r\nHost: ws.example\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
		resp, body := readUpAnswer(t, br, "GET")
		if resp.StatusCode != 200 || body != "no switch" {
			t.Fatalf("the upgrade request: %d %q", resp.StatusCode, body)
		}
		resp, _ = readUpAnswer(t, br, "POST")
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get(HeaderRequestID) == "" {
			t.Fatalf("the pipelined CL+TE request: %d %v, want egret's 400", resp.StatusCode, resp.Header)
		}
		if _, err := br.ReadByte(); err == nil {
			t.Fatal("the connection goes on after a refused head")
		}
		if got := s.list(); len(got) != 1 || !strings.HasPrefix(got[0], "GET /ws ") {
			t.Fatalf("upstream got %q, want only the upgrade request", got)
		}
		if l := log.String(); !strings.Contains(l, "outcome=rejected reason=none status=400") || !strings.Contains(l, "Content-Length together with Transfer-Encoding") {
			t.Fatalf("the refused request is not logged:\n%s", l)
		}
	})
}

// TestUpgradePortNotAllowed (finding 2): in explicit mode an upgraded
// connection is a tunnel, so an Upgrade reaches only the ports a CONNECT
// may reach: elsewhere 403, and nothing is sent.
func TestUpgradePortNotAllowed(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: anything\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw)
	})
	p := startProxy(t, Config{}) // ConnectPorts: 443 only
	c, br := dialProxy(t, p)
	io.WriteString(c, "GET "+up.url("/")+" HTTP/1.1\r\nHost: "+up.addr+"\r\nConnection: Upgrade\r\nUpgrade: anything\r\n\r\nraw bytes for the tunnel\r\n")
	resp, body := readUpAnswer(t, br, "GET")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "port") {
		t.Fatalf("Upgrade to a port CONNECT may not reach: %d %q, want 403", resp.StatusCode, body)
	}
	if n := up.conns.Load(); n != 0 {
		t.Fatalf("the upstream got %d connections", n)
	}
}

// TestUpgradeBodyFramed (finding 3): Connection naming Content-Length does
// not take the body's framing away: the body goes up as the request's body
// (the upstream sees one POST with it, not a POST and then the request the
// body spells), and the connection carries on as HTTP.
func TestUpgradeBodyFramed(t *testing.T) {
	var s seen
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		s.add(r)
		io.WriteString(w, "ok "+r.URL.Path)
	})
	inner := "GET /smuggled HTTP/1.1\r\nHost: x\r\nA: bcdefg\r\n\r\n"
	upgradeModes(t, up.addr, func(t *testing.T, cfg Config, target func(string) string) {
		s = seen{}
		p := startProxy(t, cfg)
		c, br := dialProxy(t, p)
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: ws.example\r\nConnection: Upgrade, Content-Length\r\nUpgrade: foo\r\nContent-Length: %d\r\n\r\n%s",
			target("/"), len(inner), inner)
		resp, body := readUpAnswer(t, br, "POST")
		if resp.StatusCode != 200 || body != "ok /" {
			t.Fatalf("the POST: %d %q", resp.StatusCode, body)
		}
		io.WriteString(c, "GET "+target("/after")+" HTTP/1.1\r\nHost: ws.example\r\n\r\n")
		resp, body = readUpAnswer(t, br, "GET")
		if resp.StatusCode != 200 || body != "ok /after" {
			t.Fatalf("the next request: %d %q", resp.StatusCode, body)
		}
		want := []string{fmt.Sprintf("POST / %q", inner), `GET /after ""`}
		if got := s.list(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("upstream got %q, want %q", got, want)
		}
	})
}

// replyUpstream answers every request it reads on every connection with
// reply (bytes as given), then closes the connection.
func replyUpstream(t *testing.T, reply string) (addr string, got *seen) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got = &seen{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				got.add(req)
				io.WriteString(c, reply)
				// A moment for the proxy to read the reply before the close.
				c.(*net.TCPConn).CloseWrite()
				io.Copy(io.Discard, c)
			}()
		}
	}()
	return ln.Addr().String(), got
}

// TestUnaskedSwitchIs502 (finding 4): a 101 answers only a request that
// asked to switch, to a protocol it offered, saying Upgrade and Connection:
// upgrade; otherwise it is no answer (502), never relayed, and the client
// connection stays HTTP.
func TestUnaskedSwitchIs502(t *testing.T) {
	for _, tc := range []struct{ name, reqFields, reply string }{
		{"no upgrade asked", "", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\n"},
		{"another protocol", "Connection: Upgrade\r\nUpgrade: foo\r\n", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: bar\r\nConnection: Upgrade\r\n\r\n"},
		{"no Upgrade in the 101", "Connection: Upgrade\r\nUpgrade: foo\r\n", "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\r\n"},
		{"an HTTP/1.0 request", "Connection: Upgrade\r\nUpgrade: foo\r\n", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\n"},
		{"not HTTP", "Connection: Upgrade\r\nUpgrade: foo\r\n", "SSH-2.0-OpenSSH_9.2\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := replyUpstream(t, tc.reply)
			upgradeModes(t, addr, func(t *testing.T, cfg Config, target func(string) string) {
				p := startProxy(t, cfg)
				c, br := dialProxy(t, p)
				proto := "HTTP/1.1"
				if tc.name == "an HTTP/1.0 request" {
					proto = "HTTP/1.0"
				}
				io.WriteString(c, "GET "+target("/")+" "+proto+"\r\nHost: ws.example\r\n"+tc.reqFields+"\r\n")
				resp, body := readUpAnswer(t, br, "GET")
				if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(HeaderRequestID) == "" {
					t.Fatalf("got %d %v %q, want egret's 502", resp.StatusCode, resp.Header, body)
				}
				if proto == "HTTP/1.0" {
					return
				}
				// Still HTTP: a request with both framings is refused.
				io.WriteString(c, "POST "+target("/")+" HTTP/1.1\r\nHost: ws.example\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
				if resp, _ := readUpAnswer(t, br, "POST"); resp.StatusCode != http.StatusBadRequest {
					t.Fatalf("after the 502: %d, want 400", resp.StatusCode)
				}
			})
		})
	}
}

// TestWebSocketUpgradeEndToEnd: a WebSocket-style upgrade works end to end:
// the upstream's real 101 reaches the client with its switch fields, the
// upstream speaks first, bytes go both ways, and each side's half-close
// reaches the other.
func TestWebSocketUpgradeEndToEnd(t *testing.T) {
	var s seen
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		s.add(r)
		if r.Header.Get("Upgrade") != "websocket" || r.Header.Get("Sec-WebSocket-Key") == "" ||
			!strings.EqualFold(r.Header.Get("Connection"), "upgrade") {
			http.Error(w, "not a websocket handshake", http.StatusBadRequest)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\nhello\n")
		brw.Flush()
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				brw.WriteString("bye\n") // after the client's half-close
				brw.Flush()
				return
			}
			brw.WriteString("echo " + line)
			brw.Flush()
		}
	})
	upgradeModes(t, up.addr, func(t *testing.T, cfg Config, target func(string) string) {
		p := startProxy(t, cfg)
		c, br := dialProxy(t, p)
		io.WriteString(c, "GET "+target("/chat")+" HTTP/1.1\r\nHost: ws.example\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
		resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("handshake: %v %v", resp, err)
		}
		if resp.Header.Get("Upgrade") != "websocket" || resp.Header.Get("Connection") != "Upgrade" ||
			resp.Header.Get("Sec-WebSocket-Accept") == "" || resp.Header.Get(HeaderRequestID) == "" {
			t.Fatalf("the 101's fields: %v", resp.Header)
		}
		if line, _ := br.ReadString('\n'); line != "hello\n" {
			t.Fatalf("the upstream's first bytes: %q", line)
		}
		for _, m := range []string{"one\n", "two\n"} {
			io.WriteString(c, m)
			if line, _ := br.ReadString('\n'); line != "echo "+m {
				t.Fatalf("sent %q, got %q", m, line)
			}
		}
		c.(*net.TCPConn).CloseWrite()
		rest, err := io.ReadAll(br)
		if string(rest) != "bye\n" || err != nil {
			t.Fatalf("after the client's half-close: %q %v", rest, err)
		}
	})
}

func mustAddrPort(t *testing.T, addr string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// TestUpgradeIdleTimeout: in explicit mode an upgraded connection is a
// tunnel, closed as a CONNECT tunnel is when silent both ways for
// TunnelIdleTimeout.
func TestUpgradeIdleTimeout(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: quiet\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(io.Discard, brw) // says nothing, until the proxy closes
	})
	ap := mustAddrPort(t, up.addr)
	p := startProxy(t, Config{Timeouts: Timeouts{TunnelIdleTimeout: 200 * time.Millisecond}, Bounds: Bounds{ConnectPorts: []int{int(ap.Port())}}})
	c, br := dialProxy(t, p)
	io.WriteString(c, "GET "+up.url("/")+" HTTP/1.1\r\nHost: "+up.addr+"\r\nConnection: Upgrade\r\nUpgrade: quiet\r\n\r\n")
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %v %v", resp, err)
	}
	// The client's deadline is 10 s: only the idle timeout ends this
	// read with the connection's end.
	if b, err := io.ReadAll(br); err != nil || len(b) != 0 {
		t.Fatalf("a silent upgraded connection: read %q, %v; want its end", b, err)
	}
}
