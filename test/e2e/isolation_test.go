package e2e

import (
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
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/dnstest"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
)

// policyBox is a node policy the test sets once it knows its pods'
// addresses.
type policyBox struct{ p atomic.Pointer[policy.Policy] }

func (b *policyBox) Current() *policy.Policy { return b.p.Load() }

// recorder is a listener that keeps every byte its connections received.
type recorder struct {
	net.Listener
	mu  sync.Mutex
	got bytes.Buffer
}

func (r *recorder) Accept() (net.Conn, error) {
	c, err := r.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recConn{Conn: c, r: r}, nil
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.got.Bytes())
}

type recConn struct {
	net.Conn
	r *recorder
}

func (c *recConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.r.mu.Lock()
	c.r.got.Write(p[:n])
	c.r.mu.Unlock()
	return n, err
}

func serveRecorded(t *testing.T, addr string, h http.HandlerFunc) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{Listener: ln}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(r)
	t.Cleanup(func() { srv.Close() })
	return r
}

// TestTenantIsolation: two pods of one node, one agent. Pod a (the
// attacker) names pod b's upstream, payments.test, in its Host header while
// connecting to a server of its own on the same port. Payments' bearer
// token never reaches that server (0 bytes of it), and pod a's failing
// requests retry on a budget of their own: pod b's retry to payments is
// still allowed afterwards. The node proves names with its own resolver
// (a DNS server of the test's, through which payments.test is pod b's
// upstream address).
func TestTenantIsolation(t *testing.T) {
	const token = "tok-7d41e0-payments-only"
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dns := dnstest.Start(t)
	pol := &policyBox{}
	pol.p.Store(policy.Default())
	n := newNode(t, nodeOpts{proxy: proxy.Config{Policy: pol, Shared: proxy.Shared{Names: &proxy.Names{Resolver: dns.Resolver()}}}})
	a := n.addPod(t, "tenant-a", podOpts{})
	b := n.addPod(t, "tenant-b", podOpts{})

	// Payments, pod b's upstream, on the host end of b's veth: 503 on the
	// first try of each path, then 200; it notes each Authorization.
	var mu sync.Mutex
	tries := map[string]int{}
	auths := map[string]int{}
	payments := serveRecorded(t, net.JoinHostPort(b.host4.String(), "0"), func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		tries[r.URL.Path]++
		first := tries[r.URL.Path] == 1
		auths[r.Header.Get("Authorization")]++
		mu.Unlock()
		if first {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "paid")
	})
	pay := payments.Addr().(*net.TCPAddr).AddrPort()
	// The attacker's server: same port, pod a's host end; always 503.
	attacker := serveRecorded(t, netip.AddrPortFrom(a.host4, pay.Port()).String(), func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	dns.Set("payments.test", pay.Addr())
	p, err := policy.Parse(filepath.Join(dir, "node.yaml"), fmt.Appendf(nil, `
upstreams:
  - host: payments.test
    backoff: {kind: full, base: 1ms, max: 2ms}
    budget: {ratio: 0, min_per_second: 0.2, ttl: 10s}
    credential:
      bearer_token_file: %s
      cleartext_addresses: [%s]
`, tokFile, pay.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	pol.p.Store(p)

	// The attack: five requests naming payments, to pod a's own server.
	attackURL := "http://" + netip.AddrPortFrom(a.host4, pay.Port()).String() + "/steal"
	for i := range 5 {
		r := a.curl(t, "-H", "Host: payments.test", fmt.Sprintf("%s/%d", attackURL, i))
		if r.Status != 503 || r.Headers.Get("Egret-Request-Id") == "" {
			t.Fatalf("attack %d: status %d %v", i, r.Status, r.Headers)
		}
	}
	got := attacker.bytes()
	if !bytes.Contains(got, []byte("Host: payments.test")) {
		t.Fatalf("the attacks did not reach the attacker's server through egret:\n%s", got)
	}
	if c := bytes.Count(got, []byte(token)); c != 0 || bytes.Contains(got, []byte("Authorization")) {
		t.Fatalf("the attacker's server received payments' token %d times:\n%s", c, got)
	}

	// The victim: its retry is allowed (2 tokens, none taken), and its
	// requests carry the token.
	for i := range 2 {
		r := b.curl(t, "-H", "Host: payments.test", fmt.Sprintf("http://%s/pay/%d", pay, i))
		if r.Status != 200 || attempts(r) != 2 {
			tr, _ := n.trace(r.Headers.Get("Egret-Request-Id"))
			t.Fatalf("pod b's request %d after the attack: status %d attempts %d: %+v", i, r.Status, attempts(r), tr.Attempts)
		}
	}
	// The budget really is 2 tokens: the next retry is denied.
	r := b.curl(t, "-H", "Host: payments.test", fmt.Sprintf("http://%s/pay/2", pay))
	tr, _ := n.trace(r.Headers.Get("Egret-Request-Id"))
	if r.Status != 503 || len(tr.Attempts) != 1 || tr.Attempts[0].Decision.Reason.String() != "budget_exhausted" {
		t.Fatalf("pod b's third retry: status %d %+v, want budget_exhausted", r.Status, tr.Attempts)
	}
	mu.Lock()
	withToken := auths["Bearer "+token]
	mu.Unlock()
	if withToken != 5 {
		t.Fatalf("payments got the token on %d of its 5 requests", withToken)
	}
	t.Logf("pod a: 5 requests with Host payments.test to its own server (%d bytes received there, 0 of the token); pod b: 2 retries allowed after the attack, the third denied budget_exhausted; payments got the token 5/5; budgets %v",
		len(got), n.agent.Upstreams())
}

// TestForwardProxyPod: an opted-in pod that reaches the world through its
// own forward proxy (HTTPS_PROXY, HTTP_PROXY) keeps working: curl's
// CONNECT and its absolute-form GET reach the forward proxy as curl sent
// them, and HTTPS through the tunnel succeeds.
func TestForwardProxyPod(t *testing.T) {
	n := newNode(t, nodeOpts{})
	c := n.addPod(t, "behind-proxy", podOpts{})
	dir := t.TempDir()
	// An HTTPS origin on the host end of the pod's veth, its certificate
	// for that address.
	cert, caPEM := certFor(t, c.host4)
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	oln, err := tls.Listen("tcp", net.JoinHostPort(c.host4.String(), "0"), &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	origin := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "secret over tls") }),
		ReadHeaderTimeout: 5 * time.Second}
	go origin.Serve(oln)
	t.Cleanup(func() { origin.Close() })
	led, plain := startLedger(t, c.host4)
	// The pod's forward proxy: an egret in explicit mode, which answers an
	// origin-form request 400, so a 200 shows the absolute form arrived.
	seen := &lineLog{lines: make(chan struct{}, 16)}
	fwd, err := proxy.New(proxy.Config{
		Logger: slog.New(slog.NewTextHandler(seen, nil)),
		Bounds: proxy.Bounds{ConnectPorts: []int{oln.Addr().(*net.TCPAddr).Port}},
	})
	if err != nil {
		t.Fatal(err)
	}
	fln, err := net.Listen("tcp", net.JoinHostPort(c.host4.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	go fwd.Serve(fln)
	t.Cleanup(func() { fwd.Shutdown(t.Context()) })
	proxyURL := "http://" + fln.Addr().String()

	r := c.curl(t, "--suppress-connect-headers", "--cacert", ca, "-x", proxyURL, "https://"+oln.Addr().String()+"/")
	if r.Status != 200 || r.Body != "secret over tls" {
		t.Fatalf("HTTPS through the pod's own CONNECT proxy: %d %q", r.Status, r.Body)
	}
	r = c.curl(t, "-x", proxyURL, "-H", "Ledger-Id: fwd-1", url(plain, "/abs"))
	if r.Status != 200 || led.Executions("fwd-1") != 1 {
		t.Fatalf("absolute-form through the pod's own proxy: %d, %d executions", r.Status, led.Executions("fwd-1"))
	}
	for range 2 { // the forward proxy logs each request after its answer
		select {
		case <-seen.lines:
		case <-time.After(5 * time.Second):
			t.Fatalf("the forward proxy's log:\n%s", seen.String())
		}
	}
	logs := seen.String()
	if !strings.Contains(logs, "method=CONNECT url="+oln.Addr().String()) || !strings.Contains(logs, "method=GET url="+url(plain, "/abs")) {
		t.Fatalf("the forward proxy's log:\n%s", logs)
	}
	t.Logf("pod behind its own proxy: CONNECT + HTTPS 200, absolute-form GET 200, both as the pod sent them")
}

// certFor makes a self-signed certificate for ip; it returns the pair and
// the certificate in PEM (the CA a client trusts).
func certFor(t *testing.T, ip netip.Addr) (tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: ip.String()},
		IPAddresses: []net.IP{ip.AsSlice()}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// lineLog keeps what a logger writes and signals each line.
type lineLog struct {
	mu    sync.Mutex
	b     strings.Builder
	lines chan struct{}
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.b.Write(p)
	l.mu.Unlock()
	l.lines <- struct{}{}
	return len(p), nil
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
