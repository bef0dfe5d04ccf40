package proxy

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/testkit/dnstest"
	"github.com/egret-proxy/egret/proxy/policy"
)

// The attacks of SECURITY.md on one node's transparent proxy: a pod that
// names another tenant's upstream in its Host header while connecting to
// a server of its own. Real servers on loopback, a real DNS server and a
// real resolver; the original destination of each connection is the
// address the test's client meant to reach.

// wire is a server's listener that keeps every byte its connections
// received, so that a test can say what reached it, down to the byte.
type wire struct {
	net.Listener
	mu    sync.Mutex
	got   bytes.Buffer
	conns atomic.Int64
}

func listenWire(t *testing.T, addr string) *wire {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return &wire{Listener: ln}
}

// listenPair listens on 127.0.0.1 and 127.0.0.2 with one port: a victim's
// server and an attacker's, told apart by address only, as two services
// on port 80 would be.
func listenPair(t *testing.T) (victim, attacker *wire) {
	t.Helper()
	for range 20 {
		v := listenWire(t, "127.0.0.1:0")
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.2:%d", v.addrPort().Port()))
		if err == nil {
			return v, &wire{Listener: ln}
		}
		v.Close()
	}
	t.Fatal("no port free on both 127.0.0.1 and 127.0.0.2")
	return nil, nil
}

func (w *wire) Accept() (net.Conn, error) {
	c, err := w.Listener.Accept()
	if err != nil {
		return nil, err
	}
	w.conns.Add(1)
	return &wireConn{Conn: c, w: w}, nil
}

func (w *wire) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.got.Bytes())
}

func (w *wire) addrPort() netip.AddrPort { return w.Addr().(*net.TCPAddr).AddrPort() }

type wireConn struct {
	net.Conn
	w *wire
}

func (c *wireConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.w.mu.Lock()
	c.w.got.Write(p[:n])
	c.w.mu.Unlock()
	return n, err
}

// serveWire serves h over w (and TLS when cfg is set) until the test ends.
func serveWire(t *testing.T, w *wire, cfg *tls.Config, h http.HandlerFunc) {
	t.Helper()
	var ln net.Listener = w
	if cfg != nil {
		ln = tls.NewListener(w, cfg)
	}
	srv := &http.Server{Handler: h, ErrorLog: nil, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// podRequest sends raw on a new connection to the transparent proxy p as
// a pod would whose connection to dst the kernel redirected, and reads the
// answer.
func podRequest(t *testing.T, p *testProxy, res *StaticResolver, dst netip.AddrPort, raw string) *http.Response {
	t.Helper()
	local := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(freePort(t)))
	res.Set(local, dst)
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local)}
	c, err := d.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("answer to %q: %v", firstLine(raw), err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp
}

const stolenToken = "tok-3f9a1c77e2-payments-only"

// TestStolenCredential: a pod sends Host: payments.test (or the payments
// address) to a server of its own. The payments entry's bearer token
// reaches payments only: 0 bytes of it reach the attacker's server, and
// the attacker's 401 does not run payments' refresher.
func TestStolenCredential(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	if err := os.WriteFile(tok, []byte(stolenToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "refreshed")

	payments, attacker := listenPair(t)
	serveWire(t, payments, nil, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "payments") })
	serveWire(t, attacker, nil, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/401" {
			w.WriteHeader(http.StatusUnauthorized) // asks for a fresh token
			return
		}
		io.WriteString(w, "attacker")
	})
	dns := dnstest.Start(t)
	dns.Set("payments.test", payments.addrPort().Addr())

	pay := payments.addrPort()
	pol := mustPolicy(t, fmt.Sprintf(`
upstreams:
  - host: payments.test
    credential:
      bearer_token_file: %[1]s
      refresh_command: [/bin/sh, -c, "touch %[2]s"]
      cleartext_addresses: [%[3]s]
  - host: %[3]s
    port: %[4]d
    credential:
      bearer_token_file: %[1]s
      refresh_command: [/bin/sh, -c, "touch %[2]s"]
      cleartext_addresses: [%[3]s]
`, tok, marker, pay.Addr(), pay.Port()))
	res := &StaticResolver{}
	m := testMetrics(t)
	p := startProxy(t, Config{
		Mode:     Transparent,
		Resolver: res,
		Policy:   pol,
		Shared:   Shared{Metrics: m, Names: &Names{Resolver: dns.Resolver()}},
	})

	// The attacks: another tenant's name, then its address, as Host.
	for _, host := range []string{"payments.test", pay.String()} {
		for _, path := range []string{"/", "/401"} {
			resp := podRequest(t, p, res, attacker.addrPort(),
				"GET "+path+" HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n")
			if path == "/" && readAll(t, resp.Body) != "attacker" {
				t.Fatalf("Host %s to the attacker's server: status %d", host, resp.StatusCode)
			}
		}
	}
	got := attacker.bytes()
	if n := bytes.Count(got, []byte(stolenToken)); n != 0 || bytes.Contains(got, []byte("Authorization")) {
		t.Fatalf("the attacker's server received the token %d times:\n%s", n, got)
	}
	if !bytes.Contains(got, []byte("Host: payments.test")) {
		t.Fatalf("the attacks did not reach the attacker's server as sent:\n%s", got)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the attacker's 401 ran payments' refresher")
	}
	if v := counterValue(t, m.mismatches); v != 4 {
		t.Errorf("host mismatches counted %v, want 4", v)
	}

	// The real client: by name (the name resolves to the destination) and
	// by address, payments gets its token.
	for _, host := range []string{"payments.test", pay.String()} {
		resp := podRequest(t, p, res, pay, "GET / HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n")
		if readAll(t, resp.Body) != "payments" {
			t.Fatalf("payments via Host %s: status %d", host, resp.StatusCode)
		}
	}
	if n := bytes.Count(payments.bytes(), []byte("Authorization: Bearer "+stolenToken)); n != 2 {
		t.Fatalf("payments received its token %d times, want 2:\n%s", n, payments.bytes())
	}
	t.Logf("attacker's server: %d connections, %d bytes, 0 of the token, refresher not run; payments: token on both of its requests",
		attacker.conns.Load(), len(got))
}

// TestCredentialFailsClosedWithoutDNS: when the name cannot be resolved
// (the resolver is down), nothing proves the destination: no token.
func TestCredentialFailsClosedWithoutDNS(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	os.WriteFile(tok, []byte(stolenToken), 0o600)
	payments := listenWire(t, "127.0.0.1:0")
	serveWire(t, payments, nil, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "payments") })
	pay := payments.addrPort()
	// A resolver whose server is gone: every query fails.
	dead := dnstest.Start(t)
	r := dead.Resolver()
	dead.Set("payments.test") // NXDOMAIN
	pol := mustPolicy(t, fmt.Sprintf("upstreams:\n  - host: payments.test\n    credential: {bearer_token_file: %s, cleartext_addresses: [%s]}\n", tok, pay.Addr()))
	res := &StaticResolver{}
	p := startProxy(t, Config{Mode: Transparent, Resolver: res, Policy: pol, Shared: Shared{Names: &Names{Resolver: r}}})
	resp := podRequest(t, p, res, pay, "GET / HTTP/1.1\r\nHost: payments.test\r\nConnection: close\r\n\r\n")
	if readAll(t, resp.Body) != "payments" {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if bytes.Contains(payments.bytes(), []byte(stolenToken)) {
		t.Fatal("a token went to a destination the name does not resolve to")
	}
}

// selfSigned returns a TLS certificate for names, signed by a key of its
// own (a CA nobody trusts).
func selfSigned(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestTLSProvesTheUpstream: an entry egret originates verified TLS to
// applies where the name does not resolve to the destination (the proof
// is the certificate): its token goes to the server that holds a
// certificate for the name, with a budget of the destination's own, and
// not to an attacker's server, whose certificate does not verify.
func TestTLSProvesTheUpstream(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	os.WriteFile(tok, []byte(stolenToken), 0o600)
	// httptest's certificate names example.com; it is the CA too.
	secure, attacker := listenPair(t)
	var auth atomic.Value
	cert := httptestCert(t)
	serveWire(t, secure, &tls.Config{Certificates: []tls.Certificate{cert}}, func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		io.WriteString(w, "secure")
	})
	ca := filepath.Join(dir, "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o644)
	var attackerAuth atomic.Int64
	serveWire(t, attacker, &tls.Config{Certificates: []tls.Certificate{selfSigned(t, "example.com")}}, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			attackerAuth.Add(1)
		}
	})
	pol := mustPolicy(t, fmt.Sprintf(`
upstreams:
  - host: example.com
    protocol: http1
    tls: {enabled: true, ca_file: %s}
    credential: {bearer_token_file: %s}
`, ca, tok))
	res := &StaticResolver{}
	dns := dnstest.Start(t) // example.com is not in it
	p := startProxy(t, Config{
		Mode:     Transparent,
		Resolver: res,
		Policy:   pol,
		Shared:   Shared{Names: &Names{Resolver: dns.Resolver()}},
	})

	resp := podRequest(t, p, res, secure.addrPort(), "GET / HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n")
	if readAll(t, resp.Body) != "secure" || auth.Load() != "Bearer "+stolenToken {
		t.Fatalf("the verified upstream: status %d, Authorization %q", resp.StatusCode, auth.Load())
	}
	if tr, ok := waitTrace(p, resp.Header.Get(HeaderRequestID)); !ok || tr.Upstream != secure.addrPort().String() {
		t.Fatalf("budget of a TLS-proven upstream: %q, want the destination's own %s", tr.Upstream, secure.addrPort())
	}
	resp = podRequest(t, p, res, attacker.addrPort(), "GET / HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n")
	if resp.StatusCode == http.StatusOK || attackerAuth.Load() != 0 || bytes.Contains(attacker.bytes(), []byte(stolenToken)) {
		t.Fatalf("the attacker's TLS server: status %d, %d requests with a token", resp.StatusCode, attackerAuth.Load())
	}
	if attacker.conns.Load() == 0 {
		t.Fatal("the attack did not reach the attacker's server")
	}
	t.Logf("verified TLS: token to the holder of example.com's certificate only; attacker's server: %d connections, answer %d %s",
		attacker.conns.Load(), resp.StatusCode, resp.Header.Get(HeaderOutcome))
}

// httptestCert is the certificate httptest's TLS servers use (names
// example.com, 127.0.0.1 and ::1; self-signed).
func httptestCert(t *testing.T) tls.Certificate {
	t.Helper()
	s := httptest.NewUnstartedServer(http.NotFoundHandler())
	s.StartTLS()
	defer s.Close()
	return s.TLS.Certificates[0]
}

// TestDrainedBudget: a pod that names payments in its Host while talking
// to its own failing server retries against its own budget, not payments':
// the real client's retry is still allowed afterwards. The budget is 2
// tokens, and the victim's third retry is denied, which shows the test
// would see a drained budget.
func TestDrainedBudget(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	payments, attacker := listenPair(t)
	serveWire(t, payments, nil, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path]++
		n := seen[r.URL.Path]
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "paid")
	})
	serveWire(t, attacker, nil, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	dns := dnstest.Start(t)
	dns.Set("payments.test", payments.addrPort().Addr())
	pol := mustPolicy(t, `
upstreams:
  - host: payments.test
    backoff: {kind: full, base: 1ms, max: 2ms}
    budget: {ratio: 0, min_per_second: 0.2, ttl: 10s}
`)
	res := &StaticResolver{}
	p := startProxy(t, Config{
		Mode:     Transparent,
		Resolver: res,
		Policy:   pol,
		Shared:   Shared{Names: &Names{Resolver: dns.Resolver()}},
	})
	for i := range 5 {
		resp := podRequest(t, p, res, attacker.addrPort(), "GET / HTTP/1.1\r\nHost: payments.test\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != 503 {
			t.Fatalf("attack %d: status %d", i, resp.StatusCode)
		}
	}
	victim := func(path string) (int, string) {
		resp := podRequest(t, p, res, payments.addrPort(), "GET "+path+" HTTP/1.1\r\nHost: payments.test\r\nConnection: close\r\n\r\n")
		tr, _ := waitTrace(p, resp.Header.Get(HeaderRequestID))
		last := ""
		if len(tr.Attempts) > 0 {
			last = tr.Attempts[len(tr.Attempts)-1].Decision.Reason.String()
		}
		return resp.StatusCode, last
	}
	for i := range 2 {
		if st, why := victim(fmt.Sprintf("/pay/%d", i)); st != 200 {
			t.Fatalf("victim's request %d after the attack: status %d (%s): its retry was denied", i, st, why)
		}
	}
	if st, why := victim("/pay/2"); st != 503 || why != engine.ReasonBudgetExhausted.String() {
		t.Fatalf("victim's third retry: status %d (%s), want 503 budget_exhausted: the budget is not 2 tokens", st, why)
	}
	t.Logf("5 attacks with Host payments.test retried on the attacker's own budget; payments' 2 tokens went to its real client")
}

// TestBulkheadNotTaken: a pod holding requests to its own stalled server
// under payments' Host does not take payments' bulkhead permits.
func TestBulkheadNotTaken(t *testing.T) {
	payments, attacker := listenPair(t)
	serveWire(t, payments, nil, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "paid") })
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	arrived := make(chan struct{}, 4)
	serveWire(t, attacker, nil, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
	})
	dns := dnstest.Start(t)
	dns.Set("payments.test", payments.addrPort().Addr())
	pol := mustPolicy(t, "upstreams:\n  - host: payments.test\n    bulkhead: 1\n    max_attempts: 1\n")
	res := &StaticResolver{}
	p := startProxy(t, Config{Mode: Transparent, Resolver: res, Policy: pol, Shared: Shared{Names: &Names{Resolver: dns.Resolver()}}})
	done := make(chan int, 2)
	for range 2 {
		go func() {
			resp := podRequestNoFatal(p, res, attacker.addrPort(), "GET / HTTP/1.1\r\nHost: payments.test\r\n\r\n")
			done <- resp
		}()
	}
	for i := range 2 {
		// Both stalled requests reach the attacker's server; under
		// payments' bulkhead of 1 the second would wait for a permit.
		select {
		case <-arrived:
		case st := <-done:
			t.Fatalf("stalled request %d answered %d before reaching its server", i, st)
		case <-time.After(5 * time.Second):
			t.Fatalf("stalled request %d never reached its server: it waits for payments' bulkhead", i)
		}
	}
	resp := podRequest(t, p, res, payments.addrPort(), "GET / HTTP/1.1\r\nHost: payments.test\r\nConnection: close\r\n\r\n")
	if readAll(t, resp.Body) != "paid" {
		t.Fatalf("payments while the attacker holds stalled requests: status %d %s", resp.StatusCode, resp.Header.Get(HeaderOutcome))
	}
	close(release)
	for range 2 {
		<-done
	}
}

func podRequestNoFatal(p *testProxy, res *StaticResolver, dst netip.AddrPort, raw string) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return -1
	}
	local := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	res.Set(local, dst)
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local)}
	c, err := d.Dial("tcp", p.addr)
	if err != nil {
		return -1
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, raw)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return -1
	}
	return resp.StatusCode
}

// TestCleartextCredentialRefused: a token without TLS is refused when the
// policy loads, unless the addresses it may go to are listed.
func TestCleartextCredentialRefused(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	os.WriteFile(tok, []byte("t"), 0o600)
	_, err := policy.Parse(filepath.Join(dir, "p.yaml"), []byte("upstreams:\n  - host: payments.test\n    credential: {bearer_token_file: "+tok+"}\n"))
	if err == nil || !strings.Contains(err.Error(), "cleartext_addresses") {
		t.Fatalf("a cleartext token: %v", err)
	}
	if _, err := policy.Parse(filepath.Join(dir, "p.yaml"), []byte("upstreams:\n  - host: payments.test\n    credential: {bearer_token_file: "+tok+", cleartext_addresses: [10.0.0.0/8]}\n")); err != nil {
		t.Fatalf("a listed cleartext token: %v", err)
	}
}
