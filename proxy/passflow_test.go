package proxy

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"

	"github.com/egret-proxy/egret/internal/testkit/promtest"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/retry"
	"github.com/egret-proxy/egret/witness"
)

// fakeHello is enough of a TLS record for the sniffer to take the
// connection for TLS (it has no server name).
var fakeHello = []byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00}

// flowCount is a passthrough flow counter of pod web.
func flowCount(t *testing.T, reg prometheus.Gatherer, labels ...string) float64 {
	t.Helper()
	return promtest.CounterSum(t, reg, "egret_proxy_passthrough_flows_total", append([]string{"source_pod", "web"}, labels...)...)
}

// perClient resolves each client connection to the destination set for
// its source address before it connects.
func dialFrom(t *testing.T, res *StaticResolver, proxyAddr string, dst netip.AddrPort) net.Conn {
	t.Helper()
	local := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(freePort(t)))
	res.Set(local, dst)
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local)}
	c, err := d.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := addrPortOf(t, ln)
	ln.Close()
	return a
}

// Each way a passthrough flow ends is counted once, in its class, for the
// pod whose server passed it through (another pod's server, sharing the
// metrics, counts nothing): a refused dial; a destination that resets the
// connection before egret sent it a byte (a server-first connection, so
// that egret has nothing to send); one that resets after it acknowledged
// the pod's first bytes (it answered them).
func TestPassthroughFlowOutcomes(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	res := &StaticResolver{}
	cfg := Config{Mode: Transparent, Resolver: res, Source: Source{Namespace: "shop", Pod: "web"},
		Shared: Shared{Metrics: m, Witness: witness.TCPInfo{}}, Timeouts: Timeouts{SniffTimeout: 50 * time.Millisecond}}
	p := startProxy(t, cfg)
	cfg.Source.Pod = "db"
	startProxy(t, cfg)

	// Refused.
	c := dialFrom(t, res, p.addr, closedPort(t))
	c.Write(fakeHello)
	if _, err := io.ReadAll(c); err == nil {
		t.Fatal("client not reset after a refused dial")
	}
	c.Close()

	// Reset before anything of the pod's was acknowledged.
	rst, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rst.Close()
	go func() {
		for {
			s, err := rst.Accept()
			if err != nil {
				return
			}
			closeWithReset(s)
		}
	}()
	c = dialFrom(t, res, p.addr, addrPortOf(t, rst))
	if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("silent client after the destination's reset: %v, want a reset", err)
	}
	c.Close()

	// Reset after the destination answered the pod's first bytes.
	ans, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ans.Close()
	read := make(chan struct{})
	go func() {
		s, err := ans.Accept()
		if err != nil {
			return
		}
		io.ReadFull(s, make([]byte, len(fakeHello)))
		s.Write([]byte("x"))
		<-read
		closeWithReset(s)
	}()
	c = dialFrom(t, res, p.addr, addrPortOf(t, ans))
	c.Write(fakeHello)
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	close(read)
	io.ReadAll(c) // the proxy counts the reset before it ends the client's connection
	c.Close()

	for _, tc := range []struct {
		proto, outcome, evidence string
		want                     float64
	}{
		{"tls", "connects", "", 2},
		{"tls", "established", "", 1},
		{"tls", "refused", "not_sent", 1},
		{"tls", "reset_after_ack", "sent_no_response", 1},
		{"tls", "reset_before_ack", "sent_no_response", 0},
		{"server_first", "connects", "", 1},
		{"server_first", "established", "", 1},
		{"server_first", "reset_before_ack", "sent_no_response", 1},
		{"server_first", "reset_after_ack", "sent_no_response", 0},
	} {
		if got := flowCount(t, reg, "source_namespace", "shop", "protocol", tc.proto, "destination", "other",
			"outcome", tc.outcome, "evidence", tc.evidence); got != tc.want {
			t.Errorf("%s %s = %v, want %v", tc.proto, tc.outcome, got, tc.want)
		}
	}
	// The flow that carried the pod's bytes sent at least one data
	// segment; loopback retransmits none. The segments are added as
	// egret closes its upstream socket, after the client's: no event
	// the test sees.
	testenv.Eventually(t, 5*time.Second, "segments counted", func() bool {
		return promtest.CounterSum(t, reg, "egret_proxy_passthrough_segments_total", "source_pod", "web", "protocol", "tls") >= 1
	})
	if got := promtest.CounterSum(t, reg, "egret_proxy_passthrough_retransmits_total", "source_pod", "web"); got != 0 {
		t.Errorf("retransmits = %v", got)
	}
	if got := promtest.CounterSum(t, reg, "egret_proxy_passthrough_flows_total", "source_pod", "db"); got != 0 {
		t.Errorf("pod db counted %v", got)
	}
	var safe, ambiguous uint64
	for _, pc := range m.PassthroughCounts() {
		safe += pc.SafeToRetry()
		ambiguous += pc.Ambiguous()
	}
	if safe != 1 || ambiguous != 2 {
		t.Errorf("summary: %d safe to retry, %d ambiguous; want 1, 2", safe, ambiguous)
	}
	// The pod's series go with it.
	m.Forget(Source{Namespace: "shop", Pod: "web"})
	if n := len(m.PassthroughCounts()); n != 0 {
		t.Errorf("%d series left after Forget", n)
	}
}

// A dial that gets no answer (a blackholed address, within DialTimeout)
// and one the routing refuses are counted as timed out and unreachable,
// both not_sent: nothing reached the destination.
func TestPassthroughFlowTimedOutAndUnreachable(t *testing.T) {
	ns := routeNetns(t, []string{"10.66.0.0/24", "dev", "lo"}, []string{"unreachable", "10.67.0.0/24"})
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	res := &StaticResolver{}
	p := startProxy(t, Config{Mode: Transparent, Resolver: res, Dial: ns.dial(0), Source: Source{Pod: "web"},
		Shared: Shared{Metrics: m, Witness: witness.TCPInfo{}}, Timeouts: Timeouts{DialTimeout: 300 * time.Millisecond}})
	for _, dst := range []string{"10.66.0.1:443", "10.67.0.1:443"} {
		c := dialFrom(t, res, p.addr, netip.MustParseAddrPort(dst))
		c.Write(fakeHello)
		if _, err := io.ReadAll(c); err == nil {
			t.Fatalf("%s: client not reset", dst)
		}
		c.Close()
	}
	for outcome, want := range map[string]float64{"connects": 2, "established": 0, "timed_out": 1, "unreachable": 1, "refused": 0} {
		if got := flowCount(t, reg, "protocol", "tls", "destination", "other", "outcome", outcome); got != want {
			t.Errorf("%s = %v, want %v", outcome, got, want)
		}
	}
	if got := flowCount(t, reg, "evidence", "not_sent"); got != 2 {
		t.Errorf("not_sent = %v, want 2", got)
	}
}

// routeNetns makes a network namespace with loopback up and routes: one
// through lo to addresses nothing there owns (the namespace does not
// forward, so a SYN to them is dropped without an answer, ICMP included)
// and an unreachable one.
func routeNetns(t *testing.T, routes ...[]string) *testNetns {
	t.Helper()
	testenv.RequireRoot(t)
	_, err := exec.LookPath("ip")
	testenv.Require(t, err == nil, "ip (iproute2)")
	name := fmt.Sprintf("egret-flow-%d-%d", os.Getpid(), time.Now().UnixNano()%100000)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	run("netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	run("netns", "exec", name, "ip", "link", "set", "lo", "up")
	for _, r := range routes {
		run(append([]string{"netns", "exec", name, "ip", "route", "add"}, r...)...)
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return &testNetns{name: name, ns: h}
}

// testCert makes a self-signed certificate for names.
func testCert(t *testing.T, names ...string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// A TLS flow egret passes through is labelled by the server name of its
// ClientHello when the policy names that host: a real TLS client through
// the transparent proxy to a TLS server that answers, then resets, three
// times, is "api.example.com:<port>: 3 resets after acked bytes"; a name
// the policy does not know is "other". egret never terminates the TLS:
// the client verifies the server's certificate itself.
func TestPassthroughTLSServerName(t *testing.T) {
	cert, pool := testCert(t, "api.example.com", "unknown.example.com")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dst := addrPortOf(t, ln)
	resetNow := make(chan struct{})
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			tc := tls.Server(s, &tls.Config{Certificates: []tls.Certificate{cert}})
			line, err := bufio.NewReader(tc).ReadString('\n')
			if err == nil && line == "ping\n" {
				io.WriteString(tc, "pong\n")
				<-resetNow
			}
			closeWithReset(s)
		}
	}()
	port := strconv.Itoa(int(dst.Port()))
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	res := &StaticResolver{Dst: dst}
	p := startProxy(t, Config{Mode: Transparent, Resolver: res, Source: Source{Namespace: "shop", Pod: "web"},
		Policy: mustPolicy(t, "upstreams:\n  - {host: api.example.com, port: "+port+"}\n"), Shared: Shared{Metrics: m, Witness: witness.TCPInfo{}}})

	session := func(name string) {
		t.Helper()
		raw, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		raw.SetDeadline(time.Now().Add(10 * time.Second))
		c := tls.Client(raw, &tls.Config{ServerName: name, RootCAs: pool})
		if _, err := io.WriteString(c, "ping\n"); err != nil {
			t.Fatalf("%s: %v", name, err) // the handshake, verified by the client
		}
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "pong\n" {
			t.Fatalf("%s: %q %v", name, line, err)
		}
		resetNow <- struct{}{}
		io.ReadAll(raw) // ends once egret counted the reset and closed
	}
	for range 3 {
		session("api.example.com")
	}
	session("unknown.example.com")

	named := "api.example.com:" + port
	for _, tc := range []struct {
		dest, outcome string
		want          float64
	}{
		{named, "established", 3},
		{named, "reset_after_ack", 3},
		{named, "reset_before_ack", 0},
		{"other", "established", 1},
		{"other", "reset_after_ack", 1},
	} {
		if got := flowCount(t, reg, "protocol", "tls", "destination", tc.dest, "outcome", tc.outcome); got != tc.want {
			t.Errorf("%s %s = %v, want %v", tc.dest, tc.outcome, got, tc.want)
		}
	}
	var line string
	for _, pc := range m.PassthroughCounts() {
		if pc.Destination == named {
			line = fmt.Sprintf("%s: %d resets after acked bytes", pc.Destination, pc.ResetAfterAck)
		}
	}
	if want := named + ": 3 resets after acked bytes"; line != want {
		t.Errorf("summary %q, want %q", line, want)
	}
}

// fakeServices is a Services whose ClusterIPs are the addresses of svcs.
type fakeServices map[netip.Addr]string

func (s fakeServices) Service(dst netip.AddrPort, _ string) (string, uint16, retry.Endpoints, string, bool) {
	svc, ok := s[dst.Addr()]
	return svc, dst.Port(), nil, "", ok
}

// Flows to more than 1,000 destinations leave a fixed number of series:
// only the policy's entries have a label of their own, Services up to the
// cap of unnamed upstreams, and every other destination is "other".
func TestPassthroughFlowSeriesBounded(t *testing.T) {
	const n = 1100
	dead := closedPort(t)
	port := strconv.Itoa(int(dead.Port()))
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetricsWith(reg, WorkloadOptions{UpstreamCap: 2})
	if err != nil {
		t.Fatal(err)
	}
	svcs := fakeServices{}
	for i := range 5 {
		svcs[netip.AddrFrom4([4]byte{127, 3, 0, byte(i + 1)})] = "shop/svc" + strconv.Itoa(i)
	}
	// Each client connection goes to a destination of its own, named by
	// its source port: 127.1.x.y on a port nothing listens on (refused).
	dsts := map[netip.AddrPort]bool{}
	res := ResolverFunc(func(c net.Conn) (netip.AddrPort, error) {
		port := c.RemoteAddr().(*net.TCPAddr).Port
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 1, byte(port >> 8), byte(port)}), dead.Port()), nil
	})
	pol := mustPolicy(t, "upstreams:\n  - {host: 127.2.0.1, port: "+port+"}\n  - {name: payments, host: 127.2.0.2, port: "+port+"}\n")
	p := startProxy(t, Config{Mode: Transparent, Resolver: res, Policy: pol, Source: Source{Pod: "web"}, Shared: Shared{Metrics: m, Services: svcs, Witness: witness.TCPInfo{}}})
	extra := []netip.AddrPort{netip.MustParseAddrPort("127.2.0.1:" + port), netip.MustParseAddrPort("127.2.0.2:" + port)}
	for a := range svcs {
		extra = append(extra, netip.AddrPortFrom(a, dead.Port()))
	}
	byClient := &StaticResolver{}
	q := startProxy(t, Config{Mode: Transparent, Resolver: byClient, Policy: pol, Source: Source{Pod: "web"}, Shared: Shared{Metrics: m, Services: svcs, Witness: witness.TCPInfo{}}})
	for i := range n + len(extra) {
		var c net.Conn
		if i < n {
			c, err = net.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			lp := c.LocalAddr().(*net.TCPAddr).Port
			dsts[netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 1, byte(lp >> 8), byte(lp)}), dead.Port())] = true
		} else {
			c = dialFrom(t, byClient, q.addr, extra[i-n])
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(fakeHello)
		if _, err := io.ReadAll(c); err == nil {
			t.Fatalf("connection %d: not reset", i)
		}
		c.Close()
	}
	if len(dsts) < 1000 {
		t.Fatalf("only %d distinct destinations", len(dsts))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]bool{}
	series := 0
	for _, mf := range mfs {
		if mf.GetName() != "egret_proxy_passthrough_flows_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			series++
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "destination" {
					labels[lp.GetValue()] = true
				}
			}
		}
	}
	// other, the two entries, two Services (the cap).
	if len(labels) != 5 || !labels["other"] || !labels["127.2.0.1:"+port] || !labels["payments"] {
		t.Errorf("destination labels %v", labels)
	}
	if series != 5*int(numFlowOutcomes) {
		t.Errorf("%d series, want %d", series, 5*int(numFlowOutcomes))
	}
	for _, mf := range mfs {
		if name := mf.GetName(); (name == "egret_proxy_passthrough_retransmits_total" || name == "egret_proxy_passthrough_segments_total") && len(mf.GetMetric()) != 5 {
			t.Errorf("%s: %d series, want 5", name, len(mf.GetMetric()))
		}
	}
	total := promtest.CounterSum(t, reg, "egret_proxy_passthrough_flows_total", "outcome", "refused")
	other := promtest.CounterSum(t, reg, "egret_proxy_passthrough_flows_total", "outcome", "refused", "destination", "other")
	if total != float64(n+len(extra)) || other != float64(n+3) {
		t.Errorf("refused: %v in all, %v other; want %d, %d", total, other, n+len(extra), n+3)
	}
}

// tlsServerName is the server name crypto/tls's own parser reads from
// the ClientHello in b (a server handshake over b alone, stopped once the
// hello is read): the oracle of helloServerName.
func tlsServerName(b []byte) string {
	var name string
	stop := errors.New("hello read")
	cfg := &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name = h.ServerName
		return nil, stop
	}}
	c, s := net.Pipe()
	go func() {
		c.Write(b)
		c.Close()
	}()
	go io.Copy(io.Discard, c)
	tls.Server(s, cfg).Handshake()
	s.Close()
	return name
}

// helloOf returns the first TLS record a crypto/tls client with cfg sends.
func helloOf(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	go tls.Client(c, cfg).Handshake()
	br := bufio.NewReader(s)
	hdr, err := br.Peek(5)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := br.Peek(5 + int(binary.BigEndian.Uint16(hdr[3:5])))
	if err != nil {
		t.Fatal(err)
	}
	b := append([]byte(nil), rec...)
	c.Close()
	return b
}

// The server name is read from a real ClientHello as crypto/tls reads it,
// whatever else the hello carries, and from nothing short of a whole
// first record.
func TestClientHelloSNI(t *testing.T) {
	c, s := net.Pipe()
	defer s.Close()
	go tls.Client(c, &tls.Config{ServerName: "api.example.com"}).Handshake()
	br := bufio.NewReader(s)
	if got := clientHelloSNI(s, br); got != "api.example.com" {
		t.Errorf("sni %q", got)
	}
	hello, _ := br.Peek(br.Buffered())
	c.Close()
	for _, b := range [][]byte{hello[:len(hello)/2], hello[:len(hello)-1], fakeHello, {0x16}, nil} {
		if got := helloServerName(b); got != "" {
			t.Errorf("server name of %x: %q", b, got)
		}
	}
	for _, cfg := range []*tls.Config{
		{ServerName: "api.example.com"},
		{ServerName: "API.Example.COM", NextProtos: []string{"h2", "http/1.1"}},
		{ServerName: "x." + strings.Repeat("a", 200) + ".example"},
		{ServerName: "10.0.0.1"}, // an address: no server_name sent
		{ServerName: "old.example", MaxVersion: tls.VersionTLS12},
		{ServerName: "", InsecureSkipVerify: true},
	} {
		b := helloOf(t, cfg)
		if got, want := helloServerName(b), tlsServerName(b); got != want {
			t.Errorf("%q: server name %q, crypto/tls reads %q", cfg.ServerName, got, want)
		}
	}
}

// Whatever the bytes, reading the server name does not fail, and when
// crypto/tls reads a name from them it is the one read.
func FuzzHelloServerName(f *testing.F) {
	for _, name := range []string{"api.example.com", "", "a.b"} {
		f.Add(helloOf(f, &tls.Config{ServerName: name, InsecureSkipVerify: true}))
	}
	f.Add(fakeHello)
	f.Fuzz(func(t *testing.T, b []byte) {
		got := helloServerName(b)
		if want := tlsServerName(b); want != "" && got != want {
			t.Errorf("server name %q, crypto/tls reads %q", got, want)
		}
	})
}
