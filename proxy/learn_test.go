package proxy

import (
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/internal/testkit/dnstest"
	"github.com/egret-proxy/egret/internal/testkit/promtest"
	"github.com/egret-proxy/egret/proxy/policy"
)

// recordLearner is a Learner that keeps what it was told.
type recordLearner struct {
	mu  sync.Mutex
	got map[netip.AddrPort]Protocol
}

func (l *recordLearner) LearnDirect(dst netip.AddrPort, p Protocol) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.got == nil {
		l.got = map[netip.AddrPort]Protocol{}
	}
	l.got[dst] = p
	return nil
}

func (l *recordLearner) learned() map[netip.AddrPort]Protocol {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[netip.AddrPort]Protocol{}
	for k, v := range l.got {
		out[k] = v
	}
	return out
}

// sendAndWaitClose writes b to a new connection to the proxy and reads
// until the proxy ends it, returning the read's error.
func sendAndWaitClose(t *testing.T, addr string, b []byte) error {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(c)
	return err
}

// A transparent connection sniffed as a protocol egret passes through is
// learned (the destination's port closed: the dial fails, is counted by
// reason, and the client is reset); HTTP/1.x never is, and neither is a
// destination the policy may originate TLS for.
func TestLearnerAndPassthroughDialFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()

	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	lr := &recordLearner{}
	res := &StaticResolver{Dst: closed}
	p := startProxy(t, Config{Mode: Transparent, Resolver: res, Learner: lr, Shared: Shared{Metrics: m}})

	tlsHello := []byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00}
	if err := sendAndWaitClose(t, p.addr, tlsHello); err == nil {
		t.Fatal("client not reset after a failed passthrough dial")
	}
	if got := lr.learned(); got[closed] != ProtoTLS || len(got) != 1 {
		t.Fatalf("learned %v, want %s tls", got, closed)
	}
	if n := promtest.CounterSum(t, reg, "egret_proxy_passthrough_dial_failures_total", "protocol", "tls", "reason", "refused"); n != 1 {
		t.Fatalf("dial failures{tls,refused} = %v", n)
	}
	if n := promtest.CounterSum(t, reg, "egret_proxy_learned_direct_total", "protocol", "tls"); n != 1 {
		t.Fatalf("learned_direct{tls} = %v", n)
	}

	// HTTP/1.x to the same closed port: answered by egret, not learned.
	lr2 := &recordLearner{}
	p2 := startProxy(t, Config{Mode: Transparent, Resolver: res, Learner: lr2})
	_ = sendAndWaitClose(t, p2.addr, []byte("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
	if got := lr2.learned(); len(got) != 0 {
		t.Fatalf("HTTP/1.x learned: %v", got)
	}

	// Whether a destination may be learned is decided by the entries
	// that originate TLS, not by port: a named entry on the same port
	// whose name egret's resolver does not map to the destination leaves
	// it learnable; one whose name maps to it, or an entry for its
	// address, or a wildcard on its port (whose addresses egret cannot
	// know) keeps it coming to egret.
	dns := dnstest.Start(t)
	dns.Set("elsewhere.test", netip.MustParseAddr("192.0.2.1"))
	dns.Set("here.test", closed.Addr())
	names := &Names{Resolver: dns.Resolver()}
	port := strconv.Itoa(int(closed.Port()))
	for _, tc := range []struct {
		entry string
		learn bool
	}{
		{"{host: elsewhere.test, port: " + port + ", tls: {enabled: true}}", true},
		{"{host: elsewhere.test, tls: {enabled: true}}", true},
		{"{host: here.test, port: " + strconv.Itoa(int(closed.Port())+1) + ", tls: {enabled: true}}", true},
		{"{host: here.test, port: " + port + ", tls: {enabled: false}}", true},
		{"{host: here.test, port: " + port + ", tls: {enabled: true}}", false},
		{"{host: here.test, tls: {enabled: true}}", false},
		{"{host: " + closed.Addr().String() + ", port: " + port + ", tls: {enabled: true}}", false},
		{"{host: \"*.example\", port: " + port + ", tls: {enabled: true}}", false},
	} {
		pol, err := policy.Parse("p.yaml", []byte("upstreams:\n  - "+tc.entry+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		lr := &recordLearner{}
		p := startProxy(t, Config{Mode: Transparent, Resolver: res, Learner: lr, Policy: StaticPolicy{pol}, Shared: Shared{Names: names}})
		_ = sendAndWaitClose(t, p.addr, tlsHello)
		if got := len(lr.learned()) == 1; got != tc.learn {
			t.Errorf("entry %s: learned %v, want %v", tc.entry, lr.learned(), tc.learn)
		}
	}
	// The defaults originating TLS cover every destination.
	pol, err := policy.Parse("p.yaml", []byte("defaults: {tls: {enabled: true}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	lr3 := &recordLearner{}
	p3 := startProxy(t, Config{Mode: Transparent, Resolver: res, Learner: lr3, Policy: StaticPolicy{pol}, Shared: Shared{Names: names}})
	_ = sendAndWaitClose(t, p3.addr, tlsHello)
	if got := lr3.learned(); len(got) != 0 {
		t.Fatalf("defaults with TLS: learned %v", got)
	}
}
