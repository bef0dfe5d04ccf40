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
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/proxy"
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

// eventually waits up to 10 s for cond (the agent's state: its pods, the
// fake attacher's calls, which announce nothing).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what, cond)
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
	// Ready: the kernel was told an agent serves (egret_alive).
	if !fake.Alive() {
		t.Fatal("ready, but SetAlive was not called")
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
	// Not synchronisation: the source never lists, so no event comes; a
	// while after Run starts, Ready must still refuse (an absence).
	time.Sleep(50 * time.Millisecond)
	if err := b.Ready(); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "listed") {
		t.Fatalf("source not synced: %v", err)
	}
	if b.cfg.Attacher.(*Fake).Alive() {
		t.Fatal("SetAlive before the source listed its pods: their connects would wait for pods not started")
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

// Out of descriptors, egret cannot accept: every pod's listeners are
// cleared from its kernel config (new connects go direct, rather than
// wait in an accept queue), and put back once there is room again. A pod's
// own limits come from its description, else the agent's, and are shown.
func TestOutOfDescriptorsGoesDirect(t *testing.T) {
	fake := NewFake()
	port := freePort(t)
	src, err := pods.NewMemory(pods.Pod{Name: "web", Cgroup: "/cg/web", ListenPort: port,
		Limits: pods.Limits{InFlight: 7}})
	if err != nil {
		t.Fatal(err)
	}
	fds := proxy.NewFDs(64+8, 64) // room for 4 connections
	a, err := New(Config{Attacher: fake, Source: src, FDs: fds, PodLimits: proxy.Limits{SpoolBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	eventually(t, "web running", func() bool { st, err := a.Pod("web"); return err == nil && st.State == StateRunning })
	st, _ := a.Pod("web")
	if st.Limits == nil || *st.Limits != (proxy.Limits{Conns: 1, InFlight: 7, SpoolBytes: 1 << 20}) {
		t.Fatalf("web's limits %+v, want its own in-flight, the agent's spool bytes, a fair share of connections", st.Limits)
	}
	// A fair share of 4 connections is 1: raise it to see the node run out.
	if err := src.Put(pods.Pod{Name: "web", Cgroup: "/cg/web", ListenPort: port, Limits: pods.Limits{Conns: 100, InFlight: 7}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "limits updated in place", func() bool { st, _ := a.Pod("web"); return st.Limits.Conns == 100 })
	// Another server drawing from the node's descriptors (as another
	// pod's does) takes them all.
	other, err := proxy.New(proxy.Config{Quota: proxy.NewQuota(proxy.Limits{Conns: 100}, fds)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go other.Serve(ln)
	defer other.Shutdown(context.Background())
	var held []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	eventually(t, "4 connections held", func() bool { return fds.Used() == 8 })
	if cfg, _ := fake.Config("/cg/web"); !cfg.Listen4.IsValid() {
		t.Fatal("listener cleared before the node ran out")
	}
	// web's next connection finds no descriptor.
	if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", itoa(int(port)))); err == nil {
		c.Close()
	}
	eventually(t, "the pod sent direct", func() bool { cfg, _ := fake.Config("/cg/web"); return !cfg.Listen4.IsValid() })
	held[0].Close()
	held[1].Close()
	eventually(t, "the pod redirected again", func() bool { cfg, _ := fake.Config("/cg/web"); return cfg.Listen4.Port() == port })
	if st, _ := a.Pod("web"); st.Usage == nil || st.Usage.Refused["descriptors"] != 1 {
		t.Fatalf("usage %+v", st.Usage)
	}
}

// TestPodsChanged: PodsChanged's channel closes when a pod starts, fails
// to start, or goes; taken before a status is read, it misses no change.
func TestPodsChanged(t *testing.T) {
	fake := NewFake()
	h := start(t, fake)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		timeout := time.NewTimer(5 * time.Second)
		defer timeout.Stop()
		for {
			changed := h.a.PodsChanged()
			if cond() {
				return
			}
			select {
			case <-changed:
			case <-timeout.C:
				t.Fatalf("no change told: %s", what)
			}
		}
	}
	if err := h.src.Put(pods.Pod{Name: "web", Cgroup: "/cg/web", ListenPort: freePort(t)}); err != nil {
		t.Fatal(err)
	}
	waitFor("web running", func() bool { return h.state("web") == StateRunning })

	fake.mu.Lock()
	fake.Fail["/cg/bad"] = errors.New("no such cgroup")
	fake.mu.Unlock()
	if err := h.src.Put(pods.Pod{Name: "bad", Cgroup: "/cg/bad", ListenPort: freePort(t)}); err != nil {
		t.Fatal(err)
	}
	waitFor("bad failed", func() bool { return h.state("bad") == StateFailed })

	if err := h.src.Remove("web"); err != nil {
		t.Fatal(err)
	}
	waitFor("web gone", func() bool { return h.state("web") == "absent" })
}
