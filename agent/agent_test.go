package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/pods"
)

// freePort returns a port free on 127.0.0.1 and ::1 now.
func freePort(t *testing.T) uint16 {
	t.Helper()
	port, err := FreeListenPort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func itoa(n int) string { return strconv.Itoa(n) }

func podConfigForTest() bpfload.PodConfig {
	return bpfload.PodConfig{Listen4: netip.MustParseAddrPort("127.0.0.1:1")}
}

type harness struct {
	a    *Agent
	fake *Fake
	src  *pods.Memory
	stop func()
}

func start(t *testing.T, fake *Fake, ps ...pods.Pod) *harness {
	t.Helper()
	src, err := pods.NewMemory(ps...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Attacher: fake, Source: src, SelfCgroup: "/self", RetryInterval: 20 * time.Millisecond, ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	h := &harness{a: a, fake: fake, src: src}
	h.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(func() {
		if ctx.Err() == nil {
			h.stop()
		}
	})
	return h
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("never: %s", what)
}

func (h *harness) state(name string) string {
	st, err := h.a.Pod(name)
	if err != nil {
		return "absent"
	}
	return st.State
}

func TestReconcile(t *testing.T) {
	fake := NewFake()
	// A pod pinned by an earlier agent that the source no longer has.
	stale, _ := fake.AttachPod("/cg/gone", podConfigForTest())
	port := freePort(t)
	h := start(t, fake, pods.Pod{Name: "web", Cgroup: "/cg/web", ListenPort: port})

	eventually(t, "web running", func() bool { return h.state("web") == StateRunning })
	cfg, ok := fake.Config("/cg/web")
	if !ok || cfg.Listen4.Port() != port || cfg.Listen4.Addr().String() != "127.0.0.1" {
		t.Fatalf("attached config %+v %v", cfg, ok)
	}
	eventually(t, "stale pod collected", func() bool {
		ids, _ := fake.Pods()
		for _, id := range ids {
			if id == stale {
				return false
			}
		}
		return true
	})
	if !fake.self["/self"] {
		t.Fatal("own cgroup not attached")
	}
	// The listener is up: a connection is accepted.
	c, err := net.Dial("tcp", cfg.Listen4.String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	// Exclusions change in place.
	st, _ := h.a.Pod("web")
	if err := h.src.Put(pods.Pod{Name: "web", Cgroup: "/cg/web", ListenPort: port, Exclude: pods.Exclusions{Ports: []uint16{5000}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "exclusion applied", func() bool {
		cfg, _ := fake.Config("/cg/web")
		return len(cfg.ExcludePorts) == 1
	})
	if st2, _ := h.a.Pod("web"); !st2.Since.Equal(st.Since) {
		t.Fatal("pod restarted for an exclusion change")
	}

	// A pod whose attach fails is failed, then retried.
	fake.mu.Lock()
	fake.Fail["/cg/bad"] = errors.New("no such cgroup")
	fake.mu.Unlock()
	port2 := freePort(t)
	if err := h.src.Put(pods.Pod{Name: "bad", Cgroup: "/cg/bad", ListenPort: port2}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bad failed", func() bool { return h.state("bad") == StateFailed })
	if st, _ := h.a.Pod("bad"); st.Error == "" {
		t.Fatal("failed pod without error")
	}
	// Its listener was closed again.
	if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", itoa(int(port2)))); err == nil {
		c.Close()
		t.Fatal("failed pod left its listener open")
	}
	fake.mu.Lock()
	delete(fake.Fail, "/cg/bad")
	fake.mu.Unlock()
	eventually(t, "bad recovered", func() bool { return h.state("bad") == StateRunning })

	// Removal detaches and closes the listener.
	if err := h.src.Remove("web"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "web gone", func() bool { return h.state("web") == "absent" })
	if _, ok := fake.Config("/cg/web"); ok {
		t.Fatal("web still attached")
	}
	if c, err := net.Dial("tcp", cfg.Listen4.String()); err == nil {
		c.Close()
		t.Fatal("web's listener still open")
	}
	if s := h.a.Status(); s.Pods != 1 || s.Running != 1 || !s.Synced {
		t.Fatalf("status %+v", s)
	}
}

func TestRunEndLeavesAttachmentsUnlessCleanup(t *testing.T) {
	for _, cleanup := range []bool{false, true} {
		fake := NewFake()
		src, _ := pods.NewMemory(pods.Pod{Name: "web", Cgroup: "/cg/web", ListenPort: freePort(t)})
		a, err := New(Config{Attacher: fake, Source: src, SelfCgroup: "/self", CleanupOnExit: cleanup})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		eventually(t, "running", func() bool { st, err := a.Pod("web"); return err == nil && st.State == StateRunning })
		cfg, _ := fake.Config("/cg/web")
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		_, attached := fake.Config("/cg/web")
		if attached == cleanup {
			t.Fatalf("cleanup=%v: still attached=%v", cleanup, attached)
		}
		// Either way the listener is closed: the pod fails open.
		if c, err := net.Dial("tcp", cfg.Listen4.String()); err == nil {
			c.Close()
			t.Fatalf("cleanup=%v: listener still open after Run", cleanup)
		}
	}
}

func TestAdminAPI(t *testing.T) {
	fake := NewFake()
	h := start(t, fake, pods.Pod{Name: "ns1/web", Cgroup: "/cg/web", ListenPort: freePort(t)})
	eventually(t, "running", func() bool { return h.state("ns1/web") == StateRunning })
	sock := filepath.Join(t.TempDir(), "admin.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.a.ServeAdmin(ctx, sock)
	c := AdminClient(sock)
	var resp *http.Response
	var err error
	eventually(t, "admin socket", func() bool {
		resp, err = c.Get("http://egret/pods/ns1/web")
		return err == nil
	})
	var st PodStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.Name != "ns1/web" || st.State != StateRunning {
		t.Fatalf("pod: %+v %v", st, err)
	}
	resp.Body.Close()
	for path, want := range map[string]int{"/status": 200, "/pods": 200, "/upstreams": 200, "/explain/nope": 404, "/pods/nope": 404} {
		resp, err := c.Get("http://egret" + path)
		if err != nil || resp.StatusCode != want {
			t.Fatalf("%s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
}

// Ready: not before Run, not before the source's initial list was acted
// on, then ready (a failed pod does not change that), and not once Run
// ends.
func TestReady(t *testing.T) {
	fake := NewFake()
	fake.Fail["/cg/bad"] = errors.New("refused")
	src, err := pods.NewMemory(pods.Pod{Name: "bad", Cgroup: "/cg/bad", ListenPort: freePort(t)})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Attacher: fake, Source: src, SelfCgroup: "/self", RetryInterval: time.Hour, ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Ready(); !errors.Is(err, ErrNotReady) {
		t.Fatalf("before Run: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	eventually(t, "ready", func() bool { return a.Ready() == nil })
	if st, err := a.Pod("bad"); err != nil || st.State != StateFailed {
		t.Fatalf("the failing pod: %+v %v", st, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := a.Ready(); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "stopping") {
		t.Fatalf("after Run: %v", err)
	}

	// A source that never lists: running, not ready.
	never := &silentSource{}
	b, err := New(Config{Attacher: NewFake(), Source: never, SelfCgroup: "/self", RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go b.Run(ctx)
	time.Sleep(50 * time.Millisecond)
	if err := b.Ready(); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "listed") {
		t.Fatalf("source not synced: %v", err)
	}
}

// silentSource never sends an event.
type silentSource struct{}

func (silentSource) Run(ctx context.Context, _ chan<- pods.Event) error {
	<-ctx.Done()
	return ctx.Err()
}

// Two pods on one cgroup: the second is refused with a clear error (before,
// removing either detached the cgroup while the other still showed
// running). When the first goes, the second takes the cgroup. A cgroup
// holding egret's own is refused too.
func TestPodCgroupOnePerPod(t *testing.T) {
	fake := NewFake()
	pa, pb, pr := freePort(t), freePort(t), freePort(t)
	h := start(t, fake, pods.Pod{Name: "a", Cgroup: "/cg/shared", ListenPort: pa})
	eventually(t, "a running", func() bool { return h.state("a") == StateRunning })
	if err := h.src.Put(pods.Pod{Name: "b", Cgroup: "/cg/shared", ListenPort: pb}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b failed", func() bool { return h.state("b") == StateFailed })
	st, _ := h.a.Pod("b")
	if !strings.Contains(st.Error, "cgroup /cg/shared is already pod a's: one cgroup per pod") {
		t.Fatalf("b's error: %q", st.Error)
	}
	if cfg, _ := fake.Config("/cg/shared"); cfg.Listen4.Port() != pa {
		t.Fatalf("the cgroup's config is %+v, want a's listener", cfg)
	}
	if err := h.src.Put(pods.Pod{Name: "root", Cgroup: "/", ListenPort: pr}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "root failed", func() bool { return h.state("root") == StateFailed })
	if st, _ := h.a.Pod("root"); !strings.Contains(st.Error, "holds egret's own cgroup /self") {
		t.Fatalf("root's error: %q", st.Error)
	}
	if err := h.src.Remove("a"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b running once a is gone", func() bool { return h.state("b") == StateRunning })
	if cfg, ok := fake.Config("/cg/shared"); !ok || cfg.Listen4.Port() != pb {
		t.Fatalf("after a went, the cgroup's config is %+v %v, want b's listener", cfg, ok)
	}
}
