package e2e

import (
	"bufio"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/egret-proxy/egret/test/ledger"
)

// curl runs curl in the pod and parses its -i output.
func (p *pod) curl(t *testing.T, args ...string) response {
	t.Helper()
	cmd := p.command("curl", append([]string{"-sS", "-i", "--max-time", "20"}, args...)...)
	out, err := p.run(t, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return parseHTTP(t, out)
}

func parseHTTP(t *testing.T, out string) response {
	t.Helper()
	br := bufio.NewReader(strings.NewReader(out))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("curl output %q: %v", out, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
	return response{Status: resp.StatusCode, Headers: resp.Header, Body: b.String()}
}

// startLedger serves a ledger on addr (host:0) in the current namespace.
func startLedger(t *testing.T, ip netip.Addr) (*ledger.Server, netip.AddrPort) {
	t.Helper()
	s := ledger.New()
	a, err := s.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, a.(*net.TCPAddr).AddrPort()
}

func url(ap netip.AddrPort, path string) string { return "http://" + ap.String() + path }

func attempts(r response) int {
	n, _ := strconv.Atoi(r.Headers.Get("Egret-Attempts"))
	return n
}

func TestGetRetriedThrough503(t *testing.T) {
	n := newNode(t, nodeOpts{})
	p := n.addPod(t, "web", podOpts{})
	led, up := startLedger(t, p.host4)

	// curl, knowing nothing of egret.
	r := p.curl(t, "-H", "Ledger-Id: curl-get", "-H", "Ledger-Fault: 503; times=1", url(up, "/orders"))
	if r.Status != 200 || attempts(r) != 2 {
		t.Fatalf("curl: status %d, Egret-Attempts %q, body %q", r.Status, r.Headers.Get("Egret-Attempts"), r.Body)
	}
	if got := led.Executions("curl-get"); got != 2 {
		t.Fatalf("ledger executions = %d, want 2", got)
	}

	// A Go client.
	r = p.goClient(t, request{URL: url(up, "/orders"), Headers: map[string]string{
		"Ledger-Id": "go-get", "Ledger-Fault": "503; times=1"}})
	if r.Err != "" || r.Status != 200 || attempts(r) != 2 {
		t.Fatalf("go client: %+v", r)
	}
	if got := led.Executions("go-get"); got != 2 {
		t.Fatalf("ledger executions = %d, want 2", got)
	}
	rec := led.Record("go-get")
	t.Logf("GET 503 then 200: client saw %d after %s attempts; ledger executions %d (arrivals %d)",
		r.Status, r.Headers.Get("Egret-Attempts"), len(rec.Executions), rec.Arrivals)

	// The trace says which pod's proxy dialed, from where.
	tr, ok := n.trace(r.Headers.Get("Egret-Request-Id"))
	if !ok || len(tr.Attempts) != 2 {
		t.Fatalf("trace: %+v %v", tr, ok)
	}
}

func TestPostResetAfterRequestIsAmbiguous(t *testing.T) {
	n := newNode(t, nodeOpts{})
	p := n.addPod(t, "web", podOpts{})
	led, up := startLedger(t, p.host4)

	r := p.curl(t, "-X", "POST", "--data", "amount=10", "-H", "Ledger-Id: curl-post",
		"-H", "Ledger-Fault: reset-after-read", url(up, "/payments"))
	if r.Status != 502 || r.Headers.Get("Egret-Outcome") != "ambiguous" || attempts(r) != 1 {
		t.Fatalf("curl: status %d, outcome %q, attempts %q", r.Status, r.Headers.Get("Egret-Outcome"), r.Headers.Get("Egret-Attempts"))
	}
	if got := led.Executions("curl-post"); got != 1 {
		t.Fatalf("ledger executions = %d, want 1", got)
	}
	r = p.goClient(t, request{Method: "POST", URL: url(up, "/payments"), Body: "amount=10",
		Headers: map[string]string{"Ledger-Id": "go-post", "Ledger-Fault": "reset-after-read"}})
	if r.Status != 502 || r.Headers.Get("Egret-Outcome") != "ambiguous" {
		t.Fatalf("go client: %+v", r)
	}
	if got := led.Executions("go-post"); got != 1 {
		t.Fatalf("ledger executions = %d, want 1", got)
	}
	t.Logf("POST reset after the request: client saw %d Egret-Outcome: %s; ledger executions 1",
		r.Status, r.Headers.Get("Egret-Outcome"))
}
