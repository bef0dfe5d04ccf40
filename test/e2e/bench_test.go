package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent/netns"
	"github.com/egret-proxy/egret/proxy"
)

// TestRedirectBenchmark compares, for one pod, connect() latency and
// request throughput going direct, redirected by egret's eBPF programs,
// and redirected by an iptables REDIRECT rule (to an egret proxy of the
// same configuration, which reads netfilter's SO_ORIGINAL_DST). Not part
// of CI: run it with
//
//	sudo EGRET_BENCH=1 go test -count=1 -run TestRedirectBenchmark -v ./test/e2e/
func TestRedirectBenchmark(t *testing.T) {
	if os.Getenv("EGRET_BENCH") == "" {
		t.Skip("benchmark: set EGRET_BENCH=1 to run it")
	}
	n := newNode(t, nodeOpts{})
	ebpfPod := n.addPod(t, "bench-ebpf", podOpts{})
	iptPod := makePod(t, n.top, "bench-ipt", podOpts{})

	// Upstream: a small, fast HTTP server on every host address.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(strings.Repeat("x", 64))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(body)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	// The iptables pod's egret: a transparent proxy on 127.0.0.1:15002 in
	// its namespace, original destinations from netfilter, upstreams dialed
	// from the same namespace with the same mark and witness.
	pl, err := iptPod.ns.Listen(context.Background(), "tcp4", "127.0.0.1:15002")
	if err != nil {
		t.Fatal(err)
	}
	d := &netns.Dialer{NS: iptPod.ns, Mark: n.loader.Mark(), Timeout: 5 * time.Second}
	psrv, err := proxy.New(proxy.Config{
		Mode:     proxy.Transparent,
		Resolver: proxy.SockoptResolver{},
		Dial:     d.DialContext,
		Shared:   proxy.Shared{Witness: n.loader.Witness()},
	})
	if err != nil {
		t.Fatal(err)
	}
	go psrv.Serve(pl)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		psrv.Shutdown(ctx)
	})

	spec := func(p *pod) benchSpec {
		return benchSpec{Addr: fmt.Sprintf("%s:%d", p.host4, port), Connects: 2000, Duration: 2 * time.Second, Conc: 8}
	}
	measure := func(p *pod) benchResult {
		t.Helper()
		out, err := p.run(t, p.childCmd(t, "bench", request{}, spec(p)))
		if err != nil {
			t.Fatal(err)
		}
		var r benchResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("bench output %q: %v", out, err)
		}
		return r
	}

	// Each path is measured in rounds interleaved with the others; the
	// best round of each counts (the machine's noise only slows a round).
	best := func(a, b benchResult) benchResult {
		if b.ConnectP50 == 0 {
			return a
		}
		if a.ConnectP50 == 0 {
			return b
		}
		return benchResult{
			ConnectP50: min(a.ConnectP50, b.ConnectP50), ConnectP99: min(a.ConnectP99, b.ConnectP99),
			ConnectMean: min(a.ConnectMean, b.ConnectMean), KeepAlive: max(a.KeepAlive, b.KeepAlive),
			NewConn: max(a.NewConn, b.NewConn), Errors: a.Errors + b.Errors,
		}
	}
	const rounds = 3
	var direct, ipt, ebpf benchResult
	for range rounds {
		direct = best(direct, measure(iptPod))
	}
	// egret's own upstream sockets carry its mark and are left alone (as
	// sidecar proxies' rules do), or they would loop back to it.
	rule := []string{"-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", iptPod.host4.String(), "--dport", fmt.Sprint(port),
		"-m", "mark", "!", "--mark", fmt.Sprint(n.loader.Mark()),
		"-m", "comment", "--comment", Prefix + "redirect", "-j", "REDIRECT", "--to-ports", "15002"}
	if out, err := iptPod.run(t, iptPod.command("iptables", append([]string{"-w"}, rule...)...)); err != nil {
		t.Fatalf("iptables: %v %s", err, out)
	}
	for range rounds {
		ipt = best(ipt, measure(iptPod))
		ebpf = best(ebpf, measure(ebpfPod))
	}

	// Sanity: each path went where it should.
	if r := iptPod.curl(t, spec(iptPod).Addr); r.Headers.Get("Egret-Request-Id") == "" {
		t.Fatal("iptables path not through egret")
	}
	if r := ebpfPod.curl(t, spec(ebpfPod).Addr); r.Headers.Get("Egret-Request-Id") == "" {
		t.Fatal("eBPF path not through egret")
	}

	us := func(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1000) }
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-22s %12s %12s %12s %14s %14s %7s\n", "path", "connect p50", "connect p99", "connect mean", "keep-alive r/s", "new-conn r/s", "errors")
	for _, row := range []struct {
		name string
		r    benchResult
	}{{"direct", direct}, {"egret eBPF redirect", ebpf}, {"iptables REDIRECT", ipt}} {
		fmt.Fprintf(&b, "%-22s %12s %12s %12s %14.0f %14.0f %7d\n", row.name, us(row.r.ConnectP50), us(row.r.ConnectP99),
			us(row.r.ConnectMean), row.r.KeepAlive, row.r.NewConn, row.r.Errors)
	}
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	fmt.Fprintf(&b, "connect() p50: eBPF/direct %.2f, iptables/direct %.2f, eBPF/iptables %.2f\n",
		ratio(ebpf.ConnectP50, direct.ConnectP50), ratio(ipt.ConnectP50, direct.ConnectP50), ratio(ebpf.ConnectP50, ipt.ConnectP50))
	fmt.Fprintf(&b, "connect() mean: eBPF/iptables %.2f\n", ratio(ebpf.ConnectMean, ipt.ConnectMean))
	fmt.Fprintf(&b, "throughput keep-alive: eBPF/iptables %.2f, eBPF/direct %.2f; new connection per request: eBPF/iptables %.2f, eBPF/direct %.2f\n",
		ebpf.KeepAlive/ipt.KeepAlive, ebpf.KeepAlive/direct.KeepAlive, ebpf.NewConn/ipt.NewConn, ebpf.NewConn/direct.NewConn)
	fmt.Fprintf(&b, "(best of %d interleaved rounds; %d connects and %v of requests with %d connections per round)\n",
		rounds, spec(ebpfPod).Connects, spec(ebpfPod).Duration, spec(ebpfPod).Conc)
	t.Log(b.String())
	if ebpf.ConnectP50 >= ipt.ConnectP50 {
		t.Errorf("eBPF redirection's connect() p50 %v is not below iptables' %v", ebpf.ConnectP50, ipt.ConnectP50)
	}
}
