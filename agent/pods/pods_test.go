package pods

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/cgroup2"
)

const good = `pods:
  - name: shop/web
    workload: deployment/web
    cgroup: kubepods/web
    netns: web
    listen_port: 15002
    exclude:
      ports: [5432, 8443]
      cidrs: [10.0.0.0/8, 192.0.2.7]
      default_ports: false
    learn:
      enabled: false
      ttl: 5m
    policy:
      defaults:
        max_attempts: 2
  - name: batch
    cgroup: /sys/fs/cgroup/unified/batch
    redirect_loopback: true
    exclude: {default_ports: true}
    learn: {enabled: true}
    limits:
      connections: 100
      in_flight: 20
      spool_bytes: 16MiB
`

func TestParse(t *testing.T) {
	ps, err := Parse("pods.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 {
		t.Fatalf("pods = %d", len(ps))
	}
	w := ps[0]
	if w.Cgroup != filepath.Join(cgroup2.Root(), "kubepods/web") || w.Netns != "/run/netns/web" || w.ListenPort != 15002 {
		t.Errorf("web = %+v", w)
	}
	if w.Workload != "deployment/web" || w.Namespace() != "shop" || w.ShortName() != "web" {
		t.Errorf("web: workload %q, namespace %q, name %q", w.Workload, w.Namespace(), w.ShortName())
	}
	if len(w.Exclude.Ports) != 2 || !w.Exclude.NoDefaultPorts ||
		w.Exclude.CIDRs[1] != netip.MustParsePrefix("192.0.2.7/32") {
		t.Errorf("web exclusions = %+v", w.Exclude)
	}
	if w.Learn != (Learning{Off: true, TTL: 5 * time.Minute}) {
		t.Errorf("web learn = %+v", w.Learn)
	}
	if !strings.Contains(string(w.Policy), "max_attempts: 2") {
		t.Errorf("policy = %q", w.Policy)
	}
	b := ps[1]
	if b.Workload != "" || b.Namespace() != "" || b.ShortName() != "batch" {
		t.Errorf("batch: workload %q, namespace %q, name %q", b.Workload, b.Namespace(), b.ShortName())
	}
	if b.Netns != "" || !b.RedirectLoopback || b.Exclude.NoDefaultPorts || !b.Exclude.DefaultPorts || b.Learn != (Learning{On: true}) {
		t.Errorf("batch = %+v", b)
	}
	if b.Limits != (Limits{Conns: 100, InFlight: 20, SpoolBytes: 16 << 20}) || w.Limits != (Limits{}) {
		t.Errorf("limits: batch %+v, web %+v", b.Limits, w.Limits)
	}
}

// TestParseErrorsNameTheLine: each error names the file, the line and the
// column (the key yaml/v3 refuses, the value a check refuses, the pod
// when a field is missing), as a policy file's errors do; a syntax error,
// which yaml/v3 places by line alone, names the line.
func TestParseErrorsNameTheLine(t *testing.T) {
	cases := []struct {
		name, doc, want string
	}{
		{"unknown key", "pods:\n  - name: a\n    cgroup: a\n    colour: red\n",
			`pods.yaml:4:5: unknown field "colour" (want one of cgroup, exclude, learn, limits, listen_port, name, netns, policy, redirect_loopback, workload)`},
		{"unknown exclude key", "pods:\n  - name: a\n    cgroup: a\n    exclude:\n      port: [1]\n",
			`pods.yaml:5:7: unknown field "port" (want one of cidrs, default_ports, ports)`},
		{"unknown top key", "pod:\n  - name: a\n", `pods.yaml:1:1: unknown field "pod" (want one of pods)`},
		{"no cgroup", "pods:\n  - name: a\n  - name: b\n    cgroup: b\n", "pods.yaml:2:5: pod a: cgroup is required"},
		{"duplicate", "pods:\n  - name: a\n    cgroup: a\n  - name: a\n    cgroup: b\n", "pods.yaml:4:11: pod a: name already used at line 2"},
		{"bad cidr", "pods:\n  - name: a\n    cgroup: a\n    exclude:\n      cidrs: [10.0.0.0/33]\n", "pods.yaml:5:15: pod a: excluded CIDR"},
		{"bad port", "pods:\n  - name: a\n    cgroup: a\n    listen_port: 70000\n", "pods.yaml:4:18: pod a: listen_port 70000"},
		{"bad type", "pods:\n  - name: a\n    cgroup: a\n    exclude:\n      ports: [http]\n", "pods.yaml:5:15: cannot unmarshal !!str `http`"},
		{"bad policy", "pods:\n  - name: a\n    cgroup: a\n    policy:\n      defaults:\n        max_attempts: 0\n", "pods.yaml:5:7: pod a: policy"},
		{"bad learn ttl", "pods:\n  - name: a\n    cgroup: a\n    learn:\n      ttl: soon\n", "pods.yaml:5:12: pod a: learn ttl"},
		{"syntax", "pods:\n  - name: [\n", "pods.yaml:"},
		// yaml/v3 says line 1: the list that is broken starts on line 2.
		{"syntax line", "pods:\n  - name: a\n    cgroup: x\n   netns: host\n", "pods.yaml:2: did not find expected '-' indicator"},
		// One cgroup per pod: removing one of two entries on a cgroup
		// detached it while the other still showed running.
		{"cgroup twice", "pods:\n  - name: a\n    cgroup: x/a\n  - name: b\n    cgroup: " + cgroup2.Root() + "/x/./a\n",
			"pods.yaml:5:13: pod b: cgroup " + cgroup2.Root() + "/x/a is already pod a's (line 3): one cgroup per pod"},
		// The root, or anything at or above it, would redirect every
		// process of the node, egret's own included.
		{"negative limit", "pods:\n  - name: a\n    cgroup: a\n    limits:\n      in_flight: -1\n", "pods.yaml:5:18: pod a: limits.in_flight -1 is negative"},
		{"bad spool size", "pods:\n  - name: a\n    cgroup: a\n    limits:\n      spool_bytes: lots\n", "pods.yaml:5:20: pod a: limits.spool_bytes"},
		{"cgroup .", "pods:\n  - name: a\n    cgroup: .\n", "pods.yaml:3:13: pod a: cgroup " + cgroup2.Root() + " is the cgroup v2 root"},
		{"cgroup root", "pods:\n  - name: a\n    cgroup: " + cgroup2.Root() + "/\n", "pods.yaml:3:13: pod a: cgroup " + cgroup2.Root() + " is the cgroup v2 root"},
		{"cgroup above root", "pods:\n  - name: a\n    cgroup: " + filepath.Dir(cgroup2.Root()) + "\n", "is not below the cgroup v2 root"},
		{"cgroup escapes", "pods:\n  - name: a\n    cgroup: ../../etc\n", "is not below the cgroup v2 root"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("pods.yaml", []byte(tc.doc))
			if err == nil || !errors.Is(err, ErrFile) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "raw") {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func next(t *testing.T, ch <-chan Event) Event {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}
	return Event{}
}

func TestMemoryEvents(t *testing.T) {
	m, err := NewMemory(Pod{Name: "a", Cgroup: "/x/a"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan Event)
	go m.Run(ctx, ch)
	if ev := next(t, ch); ev.Kind != Added || ev.Pod.Name != "a" {
		t.Fatalf("got %v", ev)
	}
	if ev := next(t, ch); ev.Kind != Synced {
		t.Fatalf("got %v", ev)
	}
	_ = m.Put(Pod{Name: "a", Cgroup: "/x/a", RedirectLoopback: true})
	if ev := next(t, ch); ev.Kind != Updated || !ev.Pod.RedirectLoopback {
		t.Fatalf("got %v", ev)
	}
	_ = m.Put(Pod{Name: "b", Cgroup: "/x/b"})
	if ev := next(t, ch); ev.Kind != Added || ev.Pod.Name != "b" {
		t.Fatalf("got %v", ev)
	}
	_ = m.Remove("a")
	if ev := next(t, ch); ev.Kind != Removed || ev.Pod.Name != "a" {
		t.Fatalf("got %v", ev)
	}
	if err := m.Put(Pod{Name: "c"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("pod without cgroup: %v", err)
	}
}

func TestFileReloads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pods.yaml")
	write := func(s string) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("pods:\n  - name: a\n    cgroup: a\n")
	f, err := NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Interval = 10 * time.Millisecond
	refused := make(chan error, 10)
	f.OnError = func(err error) { refused <- err }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan Event)
	go f.Run(ctx, ch)
	next(t, ch) // a
	next(t, ch) // synced

	write("pods:\n  - name: a\n    cgroup: a\n  - name: b\n    cgroup: b\n")
	if ev := next(t, ch); ev.Kind != Added || ev.Pod.Name != "b" {
		t.Fatalf("got %v", ev)
	}
	write("pods:\n  - name: a\n    cgroupp: a\n")
	select {
	case err := <-refused:
		if !strings.Contains(err.Error(), ":3:") {
			t.Fatalf("refusal without line: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("bad file not refused")
	}
	if len(f.Pods()) != 2 {
		t.Fatalf("pods after refused reload = %v", f.Pods())
	}
	write("pods: []\n")
	seen := map[string]bool{}
	for range 2 {
		ev := next(t, ch)
		if ev.Kind != Removed {
			t.Fatalf("got %v", ev)
		}
		seen[ev.Pod.Name] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("removed %v", seen)
	}
	if _, err := NewFile(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, ErrFile) {
		t.Fatalf("missing file: %v", err)
	}
}
