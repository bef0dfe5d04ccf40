package e2e

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
)

// closedPort returns an address on ip whose port nothing listens on: one
// that was free a moment ago.
func closedPort(t testing.TB, ip netip.Addr) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return a
}

// A port or CIDR the node policy's direct: section lists goes direct: the
// pod's 100 connects to a closed one are refused by the kernel exactly as
// for a pod without egret. A reload that takes it out of the list sends
// the same connects to egret (learning off: each is accepted, and reset
// after the write), and one that puts it back sends them direct again,
// without restarting the pod.
func TestPolicyDirect(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("direct: {}\n")
	w, err := policy.NewWatcher(path, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, nodeOpts{proxy: proxy.Config{Policy: w}})
	p := n.addPod(t, "web", podOpts{spec: pods.Pod{Learn: pods.Learning{Off: true}}})
	bare := makePod(t, n.top, "bare", podOpts{})
	dst := closedPort(t, p.host4)
	since := n.waitPod(t, "web", "running").Since

	reload := func(s string) {
		t.Helper()
		applied := n.agent.PolicyApplied()
		write(s)
		if err := w.Reload(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-applied:
		case <-time.After(20 * time.Second):
			t.Fatal("the policy reload was not applied")
		}
	}
	const count = 100
	const refused, reset = "connect: ECONNREFUSED", "connected, write: ok, read: ECONNRESET"
	want := bare.connects(t, dst, count)
	if want[refused] != count {
		t.Fatalf("without egret, %d connects to the closed %s: %v", count, dst, want)
	}
	for i, step := range []struct {
		policy string
		want   string
	}{
		{"direct: {}\n", reset},
		{fmt.Sprintf("direct: {ports: [%d]}\n", dst.Port()), refused},
		{"direct: {ports: []}\n", reset},
		{fmt.Sprintf("direct: {cidrs: [%s/32]}\n", dst.Addr()), refused},
		{"direct: {}\n", reset},
	} {
		if i > 0 {
			reload(step.policy)
		}
		seen := p.connects(t, dst, count)
		if seen[step.want] != count {
			t.Fatalf("policy %q: %d connects to the closed %s: %v, want %d %q (without egret: %v)",
				strings.TrimSpace(step.policy), count, dst, seen, count, step.want, want)
		}
		t.Logf("policy %q: %d connects to the closed %s: %v", strings.TrimSpace(step.policy), count, dst, seen)
	}
	if st := n.waitPod(t, "web", "running"); !st.Since.Equal(since) {
		t.Fatal("a policy reload restarted the pod")
	}
}

// 10,000 connects from a pod to distinct destinations egret passes through
// (a line protocol to closed ports: sniffed, learned, then refused) keep
// the kernel's learned map within its bound (1,024 entries here), the
// newest destinations kept: the last one's next connect goes direct.
func TestLearnedBoundUnderPodConnects(t *testing.T) {
	const max, count = 1024, 10_000
	n := newNode(t, nodeOpts{learnedMax: max})
	if n.loader.LearnedMax() != max {
		t.Fatalf("LearnedMax = %d", n.loader.LearnedMax())
	}
	p := n.addPod(t, "web", podOpts{})
	id := n.waitPod(t, "web", "running").CgroupID
	first := netip.AddrPortFrom(p.host4, 40000)
	start := time.Now()
	out, err := p.run(t, p.childCmd(t, "spread", request{URL: "tcp://" + first.String(), Body: "hello", Count: count}))
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("%d connects to distinct ports of %s in %s: %s", count, p.host4, took.Round(time.Millisecond), strings.TrimSpace(out))

	entries, err := n.loader.LearnedEntries()
	if err != nil {
		t.Fatal(err)
	}
	learned, err := n.loader.LearnedDirect(id)
	if err != nil {
		t.Fatal(err)
	}
	if entries > max || len(learned) > max || len(learned) == 0 {
		t.Fatalf("after %d destinations: %d entries in the map, %d of the pod's, bound %d", count, entries, len(learned), max)
	}
	// The newest are the ones kept.
	last := netip.AddrPortFrom(p.host4, first.Port()+count-1)
	newest, hasLast := 0, false
	for _, l := range learned {
		if l.Dst.Addr() == p.host4 && l.Dst.Port() >= first.Port()+count-max {
			newest++
		}
		hasLast = hasLast || l.Dst == last
	}
	if !hasLast {
		t.Fatalf("the last destination %s is not among the %d kept", last, len(learned))
	}
	t.Logf("%d destinations learned, %d kept (bound %d), %d of them among the newest %d", count, len(learned), max, newest, max)
	// ... and goes direct: its closed port is refused by the kernel.
	if seen := p.connects(t, last, 1); seen["connect: ECONNREFUSED"] != 1 {
		t.Fatalf("connect to the newest learned destination %s: %v, want it direct and refused", last, seen)
	}
}
