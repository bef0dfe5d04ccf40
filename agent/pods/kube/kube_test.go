package kube_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
	"github.com/egret-proxy/egret/agent/netns"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/agent/pods/kube"
	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/test/kubeapi"
)

// prefix names every cgroup and namespace the tests make.
const prefix = "egret-t-"

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// env is one test's node: a namespace on the API server, a node name no
// other test uses, and a cgroup root of its own below the cgroup v2 mount.
type env struct {
	c    *kubeapi.Cluster
	ns   string
	node string
	root string // the source's cgroup root

	mu     sync.Mutex
	errs   []error
	netnss []string
}

func newEnv(t *testing.T, c *kubeapi.Cluster) *env {
	t.Helper()
	e := &env{c: c, ns: c.Namespace(t), node: "node-" + randHex(4), root: filepath.Join(cgroup2.Root(), prefix+randHex(4))}
	if err := os.Mkdir(e.root, 0o755); err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after every pod's own cleanup.
	t.Cleanup(func() {
		removeCgroupTree(t, e.root)
		if _, err := os.Stat(e.root); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("left behind: %s", e.root)
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, n := range e.netnss {
			if _, err := os.Stat(filepath.Join(netns.Dir, n)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("left behind: namespace %s", n)
			}
		}
	})
	return e
}

func (e *env) onError(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errs = append(e.errs, err)
}

func (e *env) errors() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.errs)
}

func (e *env) source(t *testing.T, cfg kube.Config) *kube.Source {
	t.Helper()
	cfg.Client, cfg.NodeName, cfg.CgroupRoot = coreClient(t, e.c), e.node, e.root
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = 100 * time.Millisecond
	}
	if cfg.OnError == nil {
		cfg.OnError = e.onError
	}
	s, err := kube.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// podOpt changes the pod object before it is created.
type podOpt func(*corev1.Pod)

func onNode(n string) podOpt             { return func(p *corev1.Pod) { p.Spec.NodeName = n } }
func hostNetwork() podOpt                { return func(p *corev1.Pod) { p.Spec.HostNetwork = true } }
func annotations(kv ...string) podOpt    { return func(p *corev1.Pod) { p.Annotations = pairs(kv...) } }
func resources(cpu, limit string) podOpt { return func(p *corev1.Pod) { setResources(p, cpu, limit) } }

func pairs(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func setResources(p *corev1.Pod, request, limit string) {
	r := &p.Spec.Containers[0].Resources
	if request != "" {
		r.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(request), corev1.ResourceMemory: resource.MustParse("64Mi")}
	}
	if limit != "" {
		r.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(limit), corev1.ResourceMemory: resource.MustParse("64Mi")}
	}
}

// createPod stores a pod on the env's node (unless onNode says otherwise).
func (e *env) createPod(t *testing.T, name string, opts ...podOpt) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{
			NodeName:   e.node,
			Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	p, err := e.c.Client.CoreV1().Pods(e.ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// setPhase does what the kubelet would: set the pod's phase through the
// status subresource.
func (e *env) setPhase(t *testing.T, name string, phase corev1.PodPhase) {
	t.Helper()
	ctx := context.Background()
	p, err := e.c.Client.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = phase
	if _, err := e.c.Client.CoreV1().Pods(e.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// annotate sets (or, for a nil value, removes) one annotation.
func (e *env) annotate(t *testing.T, name, key string, value *string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]*string{key: value}}})
	if _, err := e.c.Client.CoreV1().Pods(e.ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func ptr(s string) *string { return &s }

// runtime is what the kubelet and the container runtime would have made
// for a pod: its cgroup (in the kubelet's layout), a container cgroup
// below it with a process, and a network namespace the process is in.
type runtime struct {
	cgroup string
	netns  string // /run/netns/NAME; "" for host network
	pid    int
}

// cgroupfsPath and systemdPath spell out the kubelet's layouts here, on
// their own, rather than asking the code under test.
func (e *env) cgroupfsPath(p *corev1.Pod) string {
	switch p.Status.QOSClass {
	case corev1.PodQOSGuaranteed:
		return filepath.Join(e.root, "kubepods", "pod"+string(p.UID))
	case corev1.PodQOSBurstable:
		return filepath.Join(e.root, "kubepods", "burstable", "pod"+string(p.UID))
	}
	return filepath.Join(e.root, "kubepods", "besteffort", "pod"+string(p.UID))
}

func (e *env) systemdPath(p *corev1.Pod) string {
	u := strings.ReplaceAll(string(p.UID), "-", "_")
	switch p.Status.QOSClass {
	case corev1.PodQOSGuaranteed:
		return filepath.Join(e.root, "kubepods.slice", "kubepods-pod"+u+".slice")
	case corev1.PodQOSBurstable:
		return filepath.Join(e.root, "kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod"+u+".slice")
	}
	return filepath.Join(e.root, "kubepods.slice", "kubepods-besteffort.slice", "kubepods-besteffort-pod"+u+".slice")
}

// startRuntime makes the pod's cgroup at path and runs `sleep` in a
// container cgroup below it, in a new network namespace (or the host's).
func (e *env) startRuntime(t *testing.T, path string, host bool) *runtime {
	t.Helper()
	r := &runtime{cgroup: path}
	ctr := filepath.Join(path, "ctr-"+randHex(4))
	if err := os.MkdirAll(ctr, 0o755); err != nil {
		t.Fatal(err)
	}
	ns := netns.Host()
	if !host {
		name := prefix + randHex(4)
		var err error
		ns, err = netns.NewNamed(name)
		if err != nil {
			t.Fatal(err)
		}
		e.mu.Lock()
		e.netnss = append(e.netnss, name)
		e.mu.Unlock()
		r.netns = filepath.Join(netns.Dir, name)
		t.Cleanup(func() {
			ns.Close()
			if err := netns.DeleteNamed(name); err != nil {
				t.Error(err)
			}
		})
	}
	cg, err := os.Open(ctr)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	r.pid = cmd.Process.Pid
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		removeCgroupTree(t, path)
	})
	return r
}

func removeCgroupTree(t *testing.T, dir string) {
	t.Helper()
	if err := bpftest.RemoveCgroupTree(dir); err != nil {
		t.Errorf("remove cgroup tree %s: %v", dir, err)
	}
}

// watcher runs a source and reads its events.
type watcher struct {
	t      *testing.T
	ch     chan pods.Event
	cancel func()
	done   chan error
}

func watch(t *testing.T, s *kube.Source) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{t: t, ch: make(chan pods.Event, 64), cancel: cancel, done: make(chan error, 1)}
	go func() { w.done <- s.Run(ctx, w.ch) }()
	t.Cleanup(w.stop)
	return w
}

func (w *watcher) stop() {
	if w.cancel == nil {
		return
	}
	w.cancel()
	w.cancel = nil
	select {
	case err := <-w.done:
		if !errors.Is(err, context.Canceled) {
			w.t.Errorf("Run returned %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		w.t.Errorf("Run did not return after its context ended")
	}
}

// expect reads the next event and checks its kind and pod name.
func (w *watcher) expect(kind pods.EventKind, name string) pods.Event {
	w.t.Helper()
	select {
	case ev := <-w.ch:
		if ev.Kind != kind || ev.Pod.Name != name {
			w.t.Fatalf("event %s %q, want %s %q (%+v)", ev.Kind, ev.Pod.Name, kind, name, ev.Pod)
		}
		return ev
	case <-time.After(15 * time.Second):
		w.t.Fatalf("no event; want %s %q", kind, name)
	}
	return pods.Event{}
}

// quiet checks that no event comes for d.
func (w *watcher) quiet(d time.Duration) {
	w.t.Helper()
	select {
	case ev := <-w.ch:
		w.t.Fatalf("unexpected event %s %q (%+v)", ev.Kind, ev.Pod.Name, ev.Pod)
	case <-time.After(d):
	}
}

func requireMachine(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
	var st unix.Statfs_t
	err := unix.Statfs(cgroup2.Root(), &st)
	testenv.Require(t, err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC, "cgroup v2 at "+cgroup2.Root())
	_, err = exec.LookPath("sleep")
	testenv.Require(t, err == nil, "sleep")
}

// TestSourceAgainstAPIServer runs the source against a real kube-apiserver
// with pods whose cgroups and namespaces the test makes as a kubelet would.
func TestSourceAgainstAPIServer(t *testing.T) {
	requireMachine(t)
	c := kubeapi.Start(t)
	t.Run("lifecycle", func(t *testing.T) { testLifecycle(t, c) })
	t.Run("bad annotations", func(t *testing.T) { testBadAnnotations(t, c) })
	t.Run("layouts and namespaces", func(t *testing.T) { testLayouts(t, c) })
	t.Run("restart", func(t *testing.T) { testRestart(t, c) })
}

func testLifecycle(t *testing.T, c *kubeapi.Cluster) {
	e := newEnv(t, c)
	// Before the source starts: a pod opted in and running (a), one not
	// opted in (plain), one opted in on another node (elsewhere, with a
	// cgroup under the same root), one opted in but Pending (later).
	a := e.createPod(t, "a", annotations(kube.AnnotationEnabled, "true"))
	e.setPhase(t, "a", corev1.PodRunning)
	ra := e.startRuntime(t, e.cgroupfsPath(a), false)
	plain := e.createPod(t, "plain")
	e.setPhase(t, "plain", corev1.PodRunning)
	e.startRuntime(t, e.cgroupfsPath(plain), false)
	elsewhere := e.createPod(t, "elsewhere", onNode("other-"+e.node), annotations(kube.AnnotationEnabled, "true"))
	e.setPhase(t, "elsewhere", corev1.PodRunning)
	e.startRuntime(t, e.cgroupfsPath(elsewhere), false)
	later := e.createPod(t, "later", annotations(kube.AnnotationEnabled, "true"), resources("100m", ""))
	if later.Status.QOSClass != corev1.PodQOSBurstable {
		t.Fatalf("later: QoS %q, want Burstable", later.Status.QOSClass)
	}

	w := watch(t, e.source(t, kube.Config{}))
	ev := w.expect(pods.Added, e.ns+"/a")
	if ev.Pod.Cgroup != ra.cgroup || ev.Pod.Netns != ra.netns {
		t.Fatalf("a: cgroup %q netns %q, want %q %q", ev.Pod.Cgroup, ev.Pod.Netns, ra.cgroup, ra.netns)
	}
	w.expect(pods.Synced, "")
	t.Logf("a added with cgroup %s, netns %s; synced", ev.Pod.Cgroup, ev.Pod.Netns)
	w.quiet(500 * time.Millisecond)

	// An annotation changes: Updated with the new exclusions.
	e.annotate(t, "a", kube.AnnotationExcludePorts, ptr("5432,8443"))
	ev = w.expect(pods.Updated, e.ns+"/a")
	if !slices.Equal(ev.Pod.Exclude.Ports, []uint16{5432, 8443}) || ev.Pod.Cgroup != ra.cgroup {
		t.Fatalf("a updated: %+v", ev.Pod)
	}

	// Running, but the runtime has not made the cgroup yet: nothing, and
	// then Added once it appears (found on the timer: no API change).
	e.setPhase(t, "later", corev1.PodRunning)
	w.quiet(700 * time.Millisecond)
	rl := e.startRuntime(t, e.cgroupfsPath(later), false)
	ev = w.expect(pods.Added, e.ns+"/later")
	if ev.Pod.Cgroup != rl.cgroup || !strings.Contains(ev.Pod.Cgroup, "/kubepods/burstable/pod") || ev.Pod.Netns != rl.netns {
		t.Fatalf("later: %+v, want cgroup %s netns %s", ev.Pod, rl.cgroup, rl.netns)
	}

	// Pending with its sandbox up (its init containers run there):
	// behind egret already; Pending without one: nothing, and nothing
	// reported.
	ip := e.createPod(t, "init", annotations(kube.AnnotationEnabled, "true"))
	if ip.Status.Phase != corev1.PodPending {
		t.Fatalf("init: phase %q, want Pending", ip.Status.Phase)
	}
	w.quiet(300 * time.Millisecond)
	ri := e.startRuntime(t, e.cgroupfsPath(ip), false)
	ev = w.expect(pods.Added, e.ns+"/init")
	if ev.Pod.Cgroup != ri.cgroup || ev.Pod.Netns != ri.netns {
		t.Fatalf("init: %+v, want cgroup %s netns %s", ev.Pod, ri.cgroup, ri.netns)
	}
	e.setPhase(t, "init", corev1.PodRunning)
	w.quiet(300 * time.Millisecond) // Running in the same place: no change

	// Opt-out, opt back in.
	e.annotate(t, "a", kube.AnnotationEnabled, ptr("false"))
	w.expect(pods.Removed, e.ns+"/a")
	e.annotate(t, "a", kube.AnnotationEnabled, ptr("true"))
	w.expect(pods.Added, e.ns+"/a")

	// A graceful delete only marks the pod (no kubelet to finish it): the
	// pod is still there, terminating, and stays behind egret meanwhile.
	pc := e.c.Client.CoreV1().Pods(e.ns)
	if err := pc.Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.quiet(500 * time.Millisecond)
	zero := int64(0)
	if err := pc.Delete(context.Background(), "a", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	w.expect(pods.Removed, e.ns+"/a")

	// The pod ends: Removed.
	e.setPhase(t, "later", corev1.PodSucceeded)
	w.expect(pods.Removed, e.ns+"/later")

	// The cgroup of a running pod goes (the runtime tore it down): Removed,
	// and Added again if it comes back.
	b := e.createPod(t, "b", annotations(kube.AnnotationEnabled, "true"))
	e.setPhase(t, "b", corev1.PodRunning)
	w.quiet(300 * time.Millisecond)
	rb := e.startRuntime(t, e.cgroupfsPath(b), false)
	w.expect(pods.Added, e.ns+"/b")
	removeCgroupTree(t, rb.cgroup)
	w.expect(pods.Removed, e.ns+"/b")

	w.quiet(500 * time.Millisecond)
	if errs := e.errors(); len(errs) > 0 {
		t.Fatalf("errors reported: %v", errs)
	}
}

func testBadAnnotations(t *testing.T, c *kubeapi.Cluster) {
	e := newEnv(t, c)
	rec, stop := kube.NewRecorder(coreClient(t, c), e.node)
	defer stop()
	bad := e.createPod(t, "bad", annotations(kube.AnnotationEnabled, "true", kube.AnnotationListenPort, "http",
		kube.AnnotationPolicy, "defaults:\n  max_attempts: 0\n"))
	e.setPhase(t, "bad", corev1.PodRunning)
	e.startRuntime(t, e.cgroupfsPath(bad), false)
	// Running, but its cgroup never appears.
	ghost := e.createPod(t, "ghost", annotations(kube.AnnotationEnabled, "true"))
	e.setPhase(t, "ghost", corev1.PodRunning)

	w := watch(t, e.source(t, kube.Config{Recorder: rec, PendingReport: 500 * time.Millisecond}))
	w.expect(pods.Synced, "")
	w.quiet(time.Second) // several reconciles: each problem reported once

	errs := e.errors()
	var annErr, notFound []error
	for _, err := range errs {
		switch {
		case errors.Is(err, kube.ErrAnnotation):
			annErr = append(annErr, err)
		case errors.Is(err, kube.ErrCgroupNotFound):
			notFound = append(notFound, err)
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if len(annErr) != 1 || len(notFound) != 1 {
		t.Fatalf("reported %d annotation errors and %d not-found errors, want one each: %v", len(annErr), len(notFound), errs)
	}
	msg := annErr[0].Error()
	for _, part := range []string{"pod " + e.ns + "/bad", `annotation egret.dev/listen-port="http"`, "not a port number",
		"annotation egret.dev/policy", "max_attempts", "left out"} {
		if !strings.Contains(msg, part) {
			t.Errorf("annotation error %q lacks %q", msg, part)
		}
	}
	var ae *kube.AnnotationError
	if !errors.As(annErr[0], &ae) || ae.Pod != e.ns+"/bad" {
		t.Errorf("not an *AnnotationError naming the pod: %#v", ae)
	}
	if m := notFound[0].Error(); !strings.Contains(m, e.ns+"/ghost") || !strings.Contains(m, string(ghost.UID)) {
		t.Errorf("not-found error %q does not name the pod", m)
	}
	t.Logf("OnError: %v", annErr[0])
	t.Logf("OnError: %v", notFound[0])

	// The same as Warning Events on the pods, through the API.
	for pod, reason := range map[string]string{"bad": kube.ReasonBadAnnotation, "ghost": kube.ReasonNotFound} {
		ev := waitEvent(t, e, pod, reason)
		if ev.Type != corev1.EventTypeWarning || ev.Source.Component != kube.Component || ev.Source.Host != e.node ||
			ev.InvolvedObject.Kind != "Pod" || ev.InvolvedObject.Namespace != e.ns {
			t.Errorf("event: %+v", ev)
		}
		t.Logf("Event on %s: %s %s %q", pod, ev.Type, ev.Reason, ev.Message)
	}

	// Fixed: Added, and nothing more reported.
	e.annotate(t, "bad", kube.AnnotationListenPort, ptr("15009"))
	w.quiet(300 * time.Millisecond) // the policy is still bad
	if n := len(e.errors()); n != 3 {
		t.Fatalf("after fixing one of two bad annotations: %d errors, want a third (the policy alone): %v", n, e.errors())
	}
	e.annotate(t, "bad", kube.AnnotationPolicy, ptr("defaults:\n  max_attempts: 2\n"))
	ev := w.expect(pods.Added, e.ns+"/bad")
	if ev.Pod.ListenPort != 15009 || string(ev.Pod.Policy) != "defaults:\n  max_attempts: 2\n" {
		t.Fatalf("bad, fixed: %+v", ev.Pod)
	}

	// A pod behind egret whose annotation turns bad is Removed, and that
	// is reported too.
	e.annotate(t, "bad", kube.AnnotationRedirectLoopback, ptr("yes"))
	w.expect(pods.Removed, e.ns+"/bad")
	errs = e.errors()
	if len(errs) != 4 || !strings.Contains(errs[3].Error(), `annotation egret.dev/redirect-loopback="yes"`) {
		t.Fatalf("after the annotation turned bad: %v", errs)
	}
}

// waitEvent polls the API for an Event on the pod with the reason (the
// recorder writes asynchronously).
func waitEvent(t *testing.T, e *env, pod, reason string) corev1.Event {
	t.Helper()
	sel := fmt.Sprintf("involvedObject.name=%s,reason=%s", pod, reason)
	var ev corev1.Event
	testenv.Eventually(t, 15*time.Second, "Event "+reason+" on pod "+pod, func() bool {
		l, err := e.c.Client.CoreV1().Events(e.ns).List(context.Background(), metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) == 0 {
			return false
		}
		ev = l.Items[0]
		return true
	})
	return ev
}

func testLayouts(t *testing.T, c *kubeapi.Cluster) {
	e := newEnv(t, c)
	// A Guaranteed pod in the systemd layout, a hostNetwork pod in the
	// cgroupfs one; the driver is auto.
	g := e.createPod(t, "guaranteed", annotations(kube.AnnotationEnabled, "true"), resources("100m", "100m"))
	if g.Status.QOSClass != corev1.PodQOSGuaranteed {
		t.Fatalf("QoS %q, want Guaranteed", g.Status.QOSClass)
	}
	e.setPhase(t, "guaranteed", corev1.PodRunning)
	rg := e.startRuntime(t, e.systemdPath(g), false)
	h := e.createPod(t, "host", annotations(kube.AnnotationEnabled, "true"), hostNetwork())
	e.setPhase(t, "host", corev1.PodRunning)
	rh := e.startRuntime(t, e.cgroupfsPath(h), true)

	rec, stop := kube.NewRecorder(coreClient(t, c), e.node)
	defer stop()
	w := watch(t, e.source(t, kube.Config{Recorder: rec}))
	gev := w.expect(pods.Added, e.ns+"/guaranteed")
	w.expect(pods.Synced, "")
	if gev.Pod.Cgroup != rg.cgroup || gev.Pod.Netns != rg.netns {
		t.Errorf("systemd layout: %+v, want %s %s", gev.Pod, rg.cgroup, rg.netns)
	}
	// The hostNetwork pod, found or not, is left out and said so: its
	// namespace is the node's, no place for a listener of its own.
	w.quiet(300 * time.Millisecond)
	w.stop()
	var hostErr error
	for _, err := range e.errors() {
		if errors.Is(err, kube.ErrHostNetwork) {
			hostErr = err
		}
	}
	if hostErr == nil || !strings.Contains(hostErr.Error(), e.ns+"/host") {
		t.Fatalf("no hostNetwork error for the pod: %v", e.errors())
	}
	ev := waitEvent(t, e, "host", kube.ReasonHostNetwork)
	if ev.Type != corev1.EventTypeWarning {
		t.Errorf("event %+v", ev)
	}
	_ = rh

	// With the driver fixed to the other layout, the Guaranteed pod is
	// not found.
	w = watch(t, e.source(t, kube.Config{Driver: kube.DriverCgroupfs}))
	w.expect(pods.Synced, "")
	w.quiet(300 * time.Millisecond)
	w.stop()

	// Without a bind mount to find, the namespace is the process's.
	w = watch(t, e.source(t, kube.Config{NetnsDirs: []string{}, Driver: kube.DriverSystemd}))
	gev = w.expect(pods.Added, e.ns+"/guaranteed")
	w.expect(pods.Synced, "")
	if want := fmt.Sprintf("/proc/%d/ns/net", rg.pid); gev.Pod.Netns != want {
		t.Errorf("netns %q, want %q", gev.Pod.Netns, want)
	}
	w.stop()
}

func testRestart(t *testing.T, c *kubeapi.Cluster) {
	e := newEnv(t, c)
	var want []string
	for _, n := range []string{"r1", "r2"} {
		p := e.createPod(t, n, annotations(kube.AnnotationEnabled, "true"))
		e.setPhase(t, n, corev1.PodRunning)
		e.startRuntime(t, e.cgroupfsPath(p), false)
		want = append(want, e.ns+"/"+n)
	}
	s := e.source(t, kube.Config{})
	w := watch(t, s)
	for _, n := range want {
		w.expect(pods.Added, n)
	}
	w.expect(pods.Synced, "")
	w.stop()

	// A change while the source is down, then the same Source runs again:
	// Added for what exists now, then Synced.
	zero := int64(0)
	if err := e.c.Client.CoreV1().Pods(e.ns).Delete(context.Background(), "r1", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	w = watch(t, s)
	w.expect(pods.Added, e.ns+"/r2")
	w.expect(pods.Synced, "")
	w.quiet(300 * time.Millisecond)

	// Run twice at once is refused.
	if err := s.Run(context.Background(), make(chan pods.Event)); !errors.Is(err, kube.ErrConfig) {
		t.Fatalf("second Run: %v, want ErrConfig", err)
	}
}

// coreClient is the source's own kind of client (kube.NewClient) for c.
func coreClient(t *testing.T, c *kubeapi.Cluster) rest.Interface {
	t.Helper()
	cl, err := kube.NewClient(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
