package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/dnstest"
)

// Issue 22, finding 1: the unspecified address and the IPv4-mapped forms
// of an address are "this host" in every guard. Real listeners count
// every connection they get; names resolve through a real DNS server.

// listenHTTP serves a fixed answer on addr (a wire: it counts its
// connections).
func listenHTTP(t *testing.T, addr, answer string) *wire {
	t.Helper()
	w := listenWire(t, addr)
	serveWire(t, w, nil, func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, answer) })
	return w
}

// TestGuardUnspecifiedIsThisHost: in explicit mode, egret's metrics
// address and its own listener are refused however the client writes
// them: 0.0.0.0, [::], [::ffff:0.0.0.0], the IPv4-mapped forms of
// 127.0.0.1, or a name that resolves to 0.0.0.0 or ::. Each is a 403
// before any attempt (a name: refused as dialled), and none reaches them.
func TestGuardUnspecifiedIsThisHost(t *testing.T) {
	m4 := listenHTTP(t, "127.0.0.1:0", "metrics")
	m6 := listenHTTP(t, "[::1]:0", "metrics")
	dns := dnstest.Start(t)
	dns.Set("zero.test", netip.IPv4Unspecified())
	dns.Set("zero6.test", netip.IPv6Unspecified())
	dns.Set("mapped.test", netip.MustParseAddr("::ffff:0.0.0.0"))
	self := listenWire(t, "127.0.0.1:0")
	p4, p6, ps := m4.addrPort().Port(), m6.addrPort().Port(), self.addrPort().Port()
	srv, err := New(Config{
		Logger: testLogger(t),
		Bounds: Bounds{Protect: []string{m4.Addr().String(), m6.Addr().String()}, ConnectPorts: []int{int(p4), int(p6), int(ps)}},
		Shared: Shared{Names: &Names{Resolver: dns.Resolver()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(self)
	t.Cleanup(func() { srv.Shutdown(t.Context()) })
	addr := self.Addr().String()

	literals := []string{
		fmt.Sprintf("0.0.0.0:%d", p4),
		fmt.Sprintf("[::ffff:0.0.0.0]:%d", p4),
		fmt.Sprintf("[::ffff:127.0.0.1]:%d", p4),
		fmt.Sprintf("[::ffff:7f00:1]:%d", p4),
		fmt.Sprintf("[0:0:0:0:0:ffff:127.0.0.1]:%d", p4),
		fmt.Sprintf("[::]:%d", p6),
		fmt.Sprintf("[0::0]:%d", p6),
		fmt.Sprintf("0.0.0.0:%d", ps),          // egret itself: a loop
		fmt.Sprintf("[::ffff:0.0.0.0]:%d", ps), // the same
		fmt.Sprintf("[::ffff:127.0.0.1]:%d", ps),
	}
	for _, hp := range literals {
		for _, raw := range []string{
			"GET http://" + hp + "/debug/pprof/cmdline HTTP/1.1\r\nHost: x\r\n\r\n",
			"CONNECT " + hp + " HTTP/1.1\r\nHost: " + hp + "\r\n\r\n",
		} {
			resp := rawRequest(t, addr, raw)
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get(HeaderAttempts) != "0" {
				t.Errorf("%s: status %d attempts %q, want 403 before any attempt", firstLine(raw), resp.StatusCode, resp.Header.Get(HeaderAttempts))
			}
		}
	}
	for _, hp := range []string{
		fmt.Sprintf("zero.test:%d", p4),
		fmt.Sprintf("mapped.test:%d", p4),
		fmt.Sprintf("zero6.test:%d", p6),
		fmt.Sprintf("zero.test:%d", ps),
	} {
		resp := rawRequest(t, addr, "GET http://"+hp+"/metrics HTTP/1.1\r\nHost: x\r\n\r\n")
		if body := readAll(t, resp.Body); resp.StatusCode == 200 || !strings.Contains(body, "destination denied") {
			t.Errorf("GET http://%s/ (a name for the unspecified address): %d %q, want it refused as dialled", hp, resp.StatusCode, body)
		}
	}
	if n, q := m4.conns.Load()+m6.conns.Load(), dns.Queries(); n != 0 || q == 0 {
		t.Errorf("egret's metrics addresses got %d connections (%d DNS questions)", n, q)
	}
	// One connection per request above: egret never dialled itself.
	if n, want := self.conns.Load(), int64(2*len(literals)+4); n != want {
		t.Errorf("egret accepted %d connections for %d requests: a loop", n, want)
	}
}

// TestDenyReachesLoopbackForms: a deny of 127.0.0.0/8 and ::1 refuses
// the addresses that reach them (0.0.0.0, [::], the mapped forms, a name
// for them), and a link-local address is denied with a zone too.
func TestDenyReachesLoopbackForms(t *testing.T) {
	t4 := listenHTTP(t, "127.0.0.1:0", "reached")
	t6 := listenHTTP(t, "[::1]:0", "reached")
	dns := dnstest.Start(t)
	dns.Set("zero.test", netip.IPv4Unspecified())
	dns.Set("zero6.test", netip.IPv6Unspecified())
	p4, p6 := t4.addrPort().Port(), t6.addrPort().Port()
	pol := mustPolicy(t, "deny_destinations: [127.0.0.0/8, \"::1/128\", fe80::/10]\n")
	p := startProxy(t, Config{Policy: pol, Shared: Shared{Names: &Names{Resolver: dns.Resolver()}}, Bounds: Bounds{ConnectPorts: []int{int(p4), int(p6), 80}}})
	for _, hp := range []string{
		fmt.Sprintf("0.0.0.0:%d", p4),
		fmt.Sprintf("[::ffff:0.0.0.0]:%d", p4),
		fmt.Sprintf("[::ffff:127.0.0.2]:%d", p4),
		fmt.Sprintf("[::]:%d", p6),
		"[fe80::a9fe:a9fe%25lo]:80",
		"[fe80::1%25eth0]:80",
	} {
		for _, raw := range []string{
			"GET http://" + hp + "/ HTTP/1.1\r\nHost: x\r\n\r\n",
			"CONNECT " + hp + " HTTP/1.1\r\nHost: x\r\n\r\n",
		} {
			resp := rawRequest(t, p.addr, raw)
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get(HeaderAttempts) != "0" {
				t.Errorf("%s: status %d attempts %q, want 403 before any attempt", firstLine(raw), resp.StatusCode, resp.Header.Get(HeaderAttempts))
			}
		}
	}
	for _, hp := range []string{fmt.Sprintf("zero.test:%d", p4), fmt.Sprintf("zero6.test:%d", p6)} {
		resp := rawRequest(t, p.addr, "GET http://"+hp+"/ HTTP/1.1\r\nHost: x\r\n\r\n")
		if body := readAll(t, resp.Body); resp.StatusCode == 200 || !strings.Contains(body, "deny_destinations") {
			t.Errorf("GET http://%s/ (a name for the unspecified address): %d %q", hp, resp.StatusCode, body)
		}
	}
	if n := t4.conns.Load() + t6.conns.Load(); n != 0 {
		t.Fatalf("the denied loopback got %d connections", n)
	}
}

// TestSelfLoopTransparent: in transparent mode a connection whose
// original destination is egret's own listener, as written or as 0.0.0.0,
// [::] or [::ffff:0.0.0.0], is closed at once: egret does not dial itself
// for it.
func TestSelfLoopTransparent(t *testing.T) {
	for _, tc := range []struct{ listen, dst string }{
		{"127.0.0.1:0", "127.0.0.1"},
		{"127.0.0.1:0", "0.0.0.0"},
		{"127.0.0.1:0", "::ffff:0.0.0.0"},
		{"127.0.0.1:0", "::ffff:127.0.0.1"},
		{"[::1]:0", "::"},
	} {
		t.Run(tc.dst, func(t *testing.T) {
			ln := listenWire(t, tc.listen)
			dst := netip.AddrPortFrom(netip.MustParseAddr(tc.dst), ln.addrPort().Port())
			// The client's connection goes to dst; any other (egret's own,
			// through itself) has no original destination.
			var first, asked atomic.Int64
			res := ResolverFunc(func(c net.Conn) (netip.AddrPort, error) {
				asked.Add(1)
				if first.CompareAndSwap(0, 1) {
					return dst, nil
				}
				return netip.AddrPort{}, ErrNoOriginalDst
			})
			srv, err := New(Config{Mode: Transparent, Resolver: res, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Shutdown(t.Context()) })
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			// Closed with the request unread: an end or a reset, no answer.
			b, err := io.ReadAll(c)
			if err != nil && !errors.Is(err, syscall.ECONNRESET) || len(b) != 0 {
				t.Errorf("a pod's connection to egret's own listener as %s: got %q %v, want it closed", dst, b, err)
			}
			if n, a := ln.conns.Load(), asked.Load(); n != 1 || a != 1 {
				t.Errorf("egret accepted %d connections (%d resolved) for one: it dialled itself", n, a)
			}
		})
	}
}
