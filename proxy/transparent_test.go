package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

func TestTransparentIPv6(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatalf("IPv6 loopback: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "v6 %s", r.Host)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	s, err := New(Config{Mode: Transparent, Resolver: &StaticResolver{Dst: dst}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(pl)
	defer s.Shutdown(t.Context())
	resp := rawRequest(t, pl.Addr().String(), "GET / HTTP/1.1\r\nHost: svc6\r\n\r\n")
	if got := readAll(t, resp.Body); got != "v6 svc6" {
		t.Fatalf("body %q", got)
	}
	checkEgretHeaders(t, resp, "1")
}

func TestTransparentPerClientDestinations(t *testing.T) {
	a := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "A") })
	b := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "B") })
	res := &StaticResolver{}
	p := startProxy(t, Config{Mode: Transparent, Resolver: res})
	for i, u := range []*upstream{a, b, a} {
		// Bind the client's port first so the resolver knows it at accept.
		local := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(freePort(t)))
		res.Set(local, u.addrPort(t))
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local)}
		c, err := d.Dial("tcp", p.addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: same.example\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		want := "A"
		if u == b {
			want = "B"
		}
		if got := readAll(t, resp.Body); got != want {
			t.Errorf("connection meant for %s reached %s", want, got)
		}
		c.Close()
	}
}

func TestTransparentUnknownDestinationClosed(t *testing.T) {
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{}})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection without an original destination was served")
	}
}

// A transparent connection that begins with the HTTP/2 preface, even in
// pieces, is served as HTTP/2 (the server's SETTINGS come back), not
// passed through: the destination hears nothing until a stream comes.
func TestTransparentServesHTTP2Preface(t *testing.T) {
	ln, got := echoServer(t, "")
	m := testMetrics(t)
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: addrPortOf(t, ln)}, Shared: Shared{Metrics: m}})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	preface := "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	// Sent in two pieces: the sniffer must wait for enough bytes.
	io.WriteString(c, preface[:5])
	time.Sleep(30 * time.Millisecond) // not synchronisation: the gap between the pieces under test
	io.WriteString(c, preface[5:])
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := http2.NewFramer(nil, c).ReadFrame()
	if err != nil {
		t.Fatalf("no HTTP/2 frame back: %v", err)
	}
	if _, ok := f.(*http2.SettingsFrame); !ok {
		t.Fatalf("first frame %v, want SETTINGS", f.Header())
	}
	select {
	case b := <-got:
		t.Fatalf("destination got %q", b)
	default:
	}
	if n := counterValue(t, m.h2Conns); n != 1 {
		t.Errorf("h2_connections = %v", n)
	}
	if n := counterValue(t, m.passthrough.WithLabelValues("http2")); n != 0 {
		t.Errorf("passthrough{http2} = %v", n)
	}
}

func TestUpgradePassedThrough(t *testing.T) {
	// A WebSocket-like upgrade: the server switches protocols and echoes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil || req.Header.Get("Upgrade") != "websocket" {
			io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		line, _ := br.ReadString('\n')
		io.WriteString(c, "echo "+line)
	}()
	for _, mode := range []Mode{Explicit, Transparent} {
		if mode == Transparent {
			ln2, _ := net.Listen("tcp", "127.0.0.1:0")
			ln.Close()
			ln = ln2
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				br := bufio.NewReader(c)
				http.ReadRequest(br)
				io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
				line, _ := br.ReadString('\n')
				io.WriteString(c, "echo "+line)
			}()
		}
		dst := ln.Addr().(*net.TCPAddr).AddrPort()
		cfg := Config{Mode: mode, Bounds: Bounds{ConnectPorts: []int{int(dst.Port())}}}
		target := "http://" + dst.String() + "/ws"
		if mode == Transparent {
			cfg.Resolver = &StaticResolver{Dst: dst}
			target = "/ws"
		}
		p := startProxy(t, cfg)
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: ws.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", target)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		if resp.StatusCode != 101 {
			t.Fatalf("%v: status %d", mode, resp.StatusCode)
		}
		io.WriteString(c, "frame\n")
		line, _ := br.ReadString('\n')
		if line != "echo frame\n" {
			t.Fatalf("%v: after the upgrade got %q", mode, line)
		}
		c.Close()
	}
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
