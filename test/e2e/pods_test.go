package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/egret-proxy/egret/test/ledger"
)

// TestTwoPodsIdenticalTuples: two pods whose clients use the same source
// port towards the same address, each redirected to 127.0.0.1:15001 of its
// own namespace, so the redirected connections' tuples are identical.
// Each pod has its own upstream at that address, inside its namespace;
// each request must reach its own pod's upstream.
func TestTwoPodsIdenticalTuples(t *testing.T) {
	n := newNode(t, nodeOpts{})
	dst := netip.MustParseAddrPort("10.200.0.1:8080")
	var ps []*pod
	var leds []*ledger.Server
	for _, name := range []string{"pod-a", "pod-b"} {
		p := n.addPod(t, name, podOpts{})
		led := ledger.New()
		t.Cleanup(func() { led.Close() })
		err := p.ns.Do(func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			a, _ := netlink.ParseAddr(dst.Addr().String() + "/32")
			if err := netlink.AddrAdd(lo, a); err != nil {
				return err
			}
			_, err = led.Listen("tcp", dst.String())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
		leds = append(leds, led)
	}
	for round := range 3 {
		for i, p := range ps {
			id := fmt.Sprintf("%s-%d", p.name, round)
			r := p.curl(t, "--local-port", fmt.Sprint(40000+round), "-H", "Ledger-Id: "+id, "-H", "Ledger-Fault: 503; times=1", url(dst, "/"))
			if r.Status != 200 || attempts(r) != 2 {
				t.Fatalf("%s: status %d attempts %q", p.name, r.Status, r.Headers.Get("Egret-Attempts"))
			}
			if got := leds[i].Executions(id); got != 2 {
				t.Fatalf("%s: own upstream executions = %d, want 2", p.name, got)
			}
			if got := leds[1-i].Executions(id); got != 0 {
				t.Fatalf("%s: the other pod's upstream executed it %d times", p.name, got)
			}
			tr, ok := n.trace(r.Headers.Get("Egret-Request-Id"))
			if !ok || tr.Upstream != dst.String() {
				t.Fatalf("%s: trace %+v", p.name, tr)
			}
			if _, by, _ := n.agent.Trace(tr.RequestID); by != p.name {
				t.Fatalf("%s's request was answered by pod %q's proxy", p.name, by)
			}
		}
	}
	t.Logf("two pods, client 127.0.0.1:4000N -> 127.0.0.1:15001 in each, original %s: each reached its own upstream (3 rounds)", dst)
}

func TestIPv6(t *testing.T) {
	n := newNode(t, nodeOpts{})
	p := n.addPod(t, "web6", podOpts{})
	led := ledger.New()
	t.Cleanup(func() { led.Close() })
	a, err := led.Listen("tcp6", net.JoinHostPort(p.host6.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	up := a.(*net.TCPAddr).AddrPort()

	r := p.curl(t, "-g", "-H", "Ledger-Id: v6-curl", "-H", "Ledger-Fault: 503; times=1", url(up, "/"))
	if r.Status != 200 || attempts(r) != 2 || led.Executions("v6-curl") != 2 {
		t.Fatalf("curl over IPv6: status %d attempts %q executions %d", r.Status, r.Headers.Get("Egret-Attempts"), led.Executions("v6-curl"))
	}
	r = p.goClient(t, request{Method: "POST", URL: url(up, "/pay"), Body: "x",
		Headers: map[string]string{"Ledger-Id": "v6-go", "Ledger-Fault": "reset-after-read"}})
	if r.Status != 502 || r.Headers.Get("Egret-Outcome") != "ambiguous" || led.Executions("v6-go") != 1 {
		t.Fatalf("go client over IPv6: %+v", r)
	}
	tr, ok := n.trace(r.Headers.Get("Egret-Request-Id"))
	if !ok || tr.Upstream != up.String() {
		t.Fatalf("trace upstream %q, want %s", tr.Upstream, up)
	}
	t.Logf("IPv6 %s: GET retried (2 executions), POST reset ambiguous (1 execution)", up)
}

// TestPodPolicyStillApplies: egret dials from the pod's namespace, so the
// pod's source address is what the upstream sees and a rule in the pod's
// namespace that blocks an address blocks it through egret too.
func TestPodPolicyStillApplies(t *testing.T) {
	n := newNode(t, nodeOpts{})
	p := n.addPod(t, "web", podOpts{})

	// Who is calling? An upstream that answers with the caller's address.
	ln, err := net.Listen("tcp", net.JoinHostPort(p.host4.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.RemoteAddr)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	whoami := ln.Addr().(*net.TCPAddr).AddrPort()
	led, blocked := startLedger(t, p.host4)

	r := p.curl(t, url(whoami, "/"))
	if attempts(r) != 1 || !strings.HasPrefix(r.Body, p.pod4.String()+":") {
		t.Fatalf("upstream saw %q (attempts %q), want the pod's address %s", r.Body, r.Headers.Get("Egret-Attempts"), p.pod4)
	}

	// Block the ledger in the pod's namespace.
	rule := []string{"OUTPUT", "-p", "tcp", "-d", blocked.Addr().String(), "--dport", fmt.Sprint(blocked.Port()),
		"-m", "comment", "--comment", Prefix + "block", "-j", "REJECT", "--reject-with", "tcp-reset"}
	ipt := p.command("iptables", append([]string{"-w", "-A"}, rule...)...)
	if out, err := p.run(t, ipt); err != nil {
		t.Fatalf("iptables: %v %s", err, out)
	}
	// Through egret: egret's own connect, made in the pod's namespace, is
	// refused by the rule, and the client is told not-sent.
	r = p.curl(t, "-H", "Ledger-Id: blocked", url(blocked, "/"))
	if r.Status != 503 || r.Headers.Get("Egret-Outcome") != "not-sent" {
		t.Fatalf("blocked address through egret: status %d outcome %q body %q", r.Status, r.Headers.Get("Egret-Outcome"), r.Body)
	}
	if rec := led.Record("blocked"); rec.Arrivals != 0 || led.Stats().Connections != 0 {
		t.Fatalf("the blocked upstream was reached: %+v", rec)
	}
	// And a direct connect (egret's listener closed by removing the pod)
	// is refused the same way.
	if err := n.src.Remove("web"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, n, "web")
	cmd := p.command("curl", "-sS", "-o", "/dev/null", "--max-time", "5", url(blocked, "/"))
	if _, err := p.run(t, cmd); err == nil || !strings.Contains(err.Error(), "exit status 7") {
		t.Fatalf("direct connect to the blocked address: %v", err)
	}
	t.Logf("upstream saw the pod's own address %s; blocked %s: through egret 503 not-sent, direct connection refused, 0 connections reached it", p.pod4, blocked)
}

func waitGone(t *testing.T, n *node, name string) {
	t.Helper()
	if !n.awaitPods(10*time.Second, func() bool { _, err := n.agent.Pod(name); return err != nil }) {
		t.Fatalf("pod %s still there", name)
	}
}

// TestNonHTTPPassesThrough: a pod's non-HTTP connection (here a line
// protocol) is redirected like any other and passed through untouched.
func TestNonHTTPPassesThrough(t *testing.T) {
	n := newNode(t, nodeOpts{})
	p := n.addPod(t, "web", podOpts{})
	ln, err := net.Listen("tcp", net.JoinHostPort(p.host4.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	peers := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		peers <- c.RemoteAddr().String()
		buf := make([]byte, 256)
		k, _ := c.Read(buf)
		c.Write([]byte("echo: " + string(buf[:k])))
	}()
	echo := ln.Addr().(*net.TCPAddr).AddrPort()
	out, err := p.run(t, p.childCmd(t, "echo", request{URL: "tcp://" + echo.String(), Body: "not http at all"}))
	if err != nil {
		t.Fatal(err)
	}
	var r response
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	peer := <-peers
	if r.Err != "" || r.Body != "echo: not http at all\n" {
		t.Fatalf("echo through egret: %+v", r)
	}
	// Redirected: the client was connected to egret's listener on the
	// pod's loopback, and the server saw egret's dial from the pod.
	if !strings.HasPrefix(r.Local, "127.0.0.1:") || !strings.HasPrefix(peer, p.pod4.String()+":") {
		t.Fatalf("client local %s, server saw %s", r.Local, peer)
	}
	t.Logf("non-HTTP line protocol passed through egret: client %s -> egret -> server saw %s", r.Local, peer)
}
