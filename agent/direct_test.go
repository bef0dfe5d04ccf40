package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/proxy/policy"
)

// The node policy's direct: section goes into every pod's kernel config,
// with the pod's own laid over it (ports and CIDRs added, the pod's
// switches winning), and a policy reload rewrites the config of running
// pods in place (they are not restarted).
func TestPolicyDirectReachesPodsAndReloads(t *testing.T) {
	if policy.DefaultLearnTTL != bpfload.DefaultLearnTTL {
		t.Fatalf("policy.DefaultLearnTTL %s is not bpfload.DefaultLearnTTL %s", policy.DefaultLearnTTL, bpfload.DefaultLearnTTL)
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("direct:\n  ports: [9000]\n  cidrs: [10.9.0.0/16]\n")
	w, err := policy.NewWatcher(path, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	fake := NewFake()
	src, err := pods.NewMemory(
		pods.Pod{Name: "web", Cgroup: "/cg/web", ListenPort: freePort(t), Exclude: pods.Exclusions{Ports: []uint16{5000}}},
		pods.Pod{Name: "own", Cgroup: "/cg/own", ListenPort: freePort(t),
			Exclude: pods.Exclusions{DefaultPorts: true}, Learn: pods.Learning{On: true}},
	)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Attacher: fake, Source: src, SelfCgroup: "/self", Policy: w, ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	for _, name := range []string{"web", "own"} {
		waitRunning(t, a, name)
	}
	check := func(cg string, ports []uint16, cidrs []string, noDefaults, noLearn bool) {
		t.Helper()
		cfg, ok := fake.Config(cg)
		if !ok {
			t.Fatalf("%s not attached", cg)
		}
		var want []netip.Prefix
		for _, c := range cidrs {
			want = append(want, netip.MustParsePrefix(c))
		}
		if !slices.Equal(cfg.ExcludePorts, ports) || !slices.Equal(cfg.ExcludePrefixes, want) ||
			cfg.NoDefaultExcludes != noDefaults || cfg.NoLearn != noLearn {
			t.Fatalf("%s: ports %v, prefixes %v, no default ports %v, no learning %v; want %v, %v, %v, %v",
				cg, cfg.ExcludePorts, cfg.ExcludePrefixes, cfg.NoDefaultExcludes, cfg.NoLearn, ports, want, noDefaults, noLearn)
		}
	}
	check("/cg/web", []uint16{9000, 5000}, []string{"10.9.0.0/16"}, false, false)
	check("/cg/own", []uint16{9000}, []string{"10.9.0.0/16"}, false, false)
	since, _ := a.Pod("web")

	// The node turns default ports and learning off and lists another
	// port: web follows; own keeps what it set itself.
	applied := a.PolicyApplied()
	write("direct:\n  ports: [9100]\n  default_ports: false\n  learn: {enabled: false}\n")
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, applied)
	check("/cg/web", []uint16{9100, 5000}, nil, true, true)
	check("/cg/own", []uint16{9100}, nil, false, false)
	if st, _ := a.Pod("web"); !st.Since.Equal(since.Since) {
		t.Fatal("a policy reload restarted the pod")
	}

	// A reload that leaves direct: alone writes nothing.
	before := fake.attaches()
	applied = a.PolicyApplied()
	write("defaults: {max_attempts: 2}\ndirect:\n  ports: [9100]\n  default_ports: false\n  learn: {enabled: false}\n")
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, applied)
	if n := fake.attaches(); n != before {
		t.Fatalf("%d kernel config writes for a reload that did not touch direct:", n-before)
	}

	// What the pods learned is forgotten when the entries that originate
	// TLS change (a destination the policy now originates TLS for must
	// not stay direct), not on other reloads.
	st, _ := a.Pod("own")
	dst := netip.MustParseAddrPort("192.0.2.9:443")
	if err := fake.LearnDirect(st.CgroupID, dst, bpfload.DirectTLS, time.Minute); err != nil {
		t.Fatal(err)
	}
	applied = a.PolicyApplied()
	write("defaults: {max_attempts: 3}\ndirect:\n  ports: [9100]\n  default_ports: false\n  learn: {enabled: false}\n")
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, applied)
	if got := fake.Learned(st.CgroupID); len(got) != 1 {
		t.Fatalf("a reload that left TLS origination alone forgot %v", got)
	}
	applied = a.PolicyApplied()
	write("upstreams:\n  - {host: 192.0.2.9, port: 443, tls: {enabled: true}}\ndirect:\n  ports: [9100]\n  default_ports: false\n  learn: {enabled: false}\n")
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, applied)
	if got := fake.Learned(st.CgroupID); len(got) != 0 {
		t.Fatalf("after the policy took TLS origination for %s, the pod still has %v learned", dst, got)
	}
}

// waitRunning waits for the pod to run, on the agent's word.
func waitRunning(t *testing.T, a *Agent, name string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ch := a.PodsChanged()
		if st, err := a.Pod(name); err == nil && st.State == StateRunning {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("pod %s never ran", name)
		}
	}
}

// waitApplied waits for the agent to apply a policy reload.
func waitApplied(t *testing.T, applied <-chan struct{}) {
	t.Helper()
	select {
	case <-applied:
	case <-time.After(10 * time.Second):
		t.Fatal("the policy reload was not applied")
	}
}
