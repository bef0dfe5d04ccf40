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
	"strconv"
	"testing"

	"github.com/egret-proxy/egret/proxy/policy"
)

// kernelPeer is the address a connect(2) to a:port reaches, as the
// kernel says: a connected UDP socket's peer (no packet is sent). false:
// the kernel refused the address (no route, no such zone).
func kernelPeer(a netip.Addr, port uint16) (netip.Addr, bool) {
	// "udp": the family Go picks, as for egret's "tcp" dials (a mapped
	// address goes as IPv4).
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, port)))
	if err != nil {
		return netip.Addr{}, false
	}
	defer c.Close()
	ra, ok := c.RemoteAddr().(*net.UDPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	return ra.AddrPort().Addr().Unmap().WithZone(""), true
}

// FuzzGuardAddress holds the explicit-mode guards to the kernel: for a
// host as a client writes it in a URL (IPv4, IPv6, zones, mapped,
// unspecified, numeric forms, names), egret refuses the target exactly
// when the address a connect(2) to it reaches is denied (or, written with
// a zone, is in a denied prefix without it) or is egret's own listener or
// protected address. A host that is no address literal to egret is no
// literal to Go's dialer either: it is resolved, and each address checked
// as dialled (TestGuardUnspecifiedIsThisHost).
func FuzzGuardAddress(f *testing.F) {
	for _, h := range []string{
		"0.0.0.0", "[::]", "[::ffff:0.0.0.0]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]",
		"[0:0:0:0:0:ffff:127.0.0.1]", "127.0.0.1", "127.1.2.3", "[::1]", "[0::1]",
		"[fe80::1%25lo]", "[fe80::a9fe:a9fe%25eth0]", "169.254.169.254", "[::ffff:169.254.169.254]",
		"[::ffff:a9fe:a9fe]", "10.9.1.1", "[::ffff:10.9.1.1]", "[fd00:ec2::254]", "[64:ff9b::7f00:1]",
		"[::127.0.0.1]", "2130706433", "0x7f.0.0.1", "0177.0.0.1", "127.1", "localhost", "egret.test",
		"[::ffff:0:0]", "0", "[::%25lo]", "[::ffff:0.0.0.0%25lo]",
	} {
		f.Add(h, uint16(0))
		f.Add(h, uint16(1))
		f.Add(h, uint16(2))
	}
	doc, err := policy.Parse(f.TempDir()+"/policy.yaml", []byte("deny_destinations: [169.254.0.0/16, fe80::/10, \"fd00:ec2::254/128\", 10.9.0.0/16]\n"))
	if err != nil {
		f.Fatal(err)
	}
	pol := StaticPolicy{doc}
	self, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	protect6, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { protect6.Close() })
	srv, err := New(Config{Policy: pol, Bounds: Bounds{Protect: []string{protect6.Addr().String()}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	go srv.Serve(self)
	f.Cleanup(func() { srv.Shutdown(context.Background()) })
	// An answer means Serve accepts: its listener is registered.
	c, err := net.Dial("tcp", self.Addr().String())
	if err != nil {
		f.Fatal(err)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
		f.Fatal(err)
	}
	c.Close()
	selfAP := self.Addr().(*net.TCPAddr).AddrPort()
	protAP := protect6.Addr().(*net.TCPAddr).AddrPort()
	ports := []uint16{selfAP.Port(), protAP.Port(), 80}
	deny := pol.Current()

	f.Fuzz(func(t *testing.T, host string, pick uint16) {
		port := ports[int(pick)%len(ports)]
		u, err := url.ParseRequestURI("http://" + host + ":" + strconv.Itoa(int(port)) + "/")
		if err != nil || u.Port() != strconv.Itoa(int(port)) {
			return // egret refuses the request line, or the port is not ours
		}
		h := u.Hostname()
		a, err := netip.ParseAddr(h)
		if err != nil {
			if ip := net.ParseIP(h); ip != nil {
				t.Fatalf("%q: no address to egret, but one to Go's dialer: %v", h, ip)
			}
			return // a name: checked as dialled
		}
		refused := srv.checkTarget(h, int(port)) != nil
		bare := a.Unmap().WithZone("")
		if deny.Denied(bare) && !refused {
			t.Fatalf("%q: %v is denied, but not %q", h, bare, h)
		}
		peer, ok := kernelPeer(a, port)
		if !ok {
			return
		}
		want := deny.Denied(peer) || deny.Denied(bare) ||
			peer == selfAP.Addr() && port == selfAP.Port() ||
			peer == netip.IPv6Loopback() && port == protAP.Port()
		if refused != want {
			t.Fatalf("%q port %d: the kernel connects it to %v; refused %v, want %v", h, port, peer, refused, want)
		}
	})
}
