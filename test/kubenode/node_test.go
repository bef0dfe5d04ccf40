package kubenode_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/test/kubenode"
)

// TestRealNode installs egret from deploy/kubernetes, unmodified, on a
// real kubelet + containerd node (test/kubenode) and puts it through what
// a node does to a DaemonSet: pods opted in and out, restarts of every
// kind, an uninstall. The subtests share the node and run in order.
func TestRealNode(t *testing.T) {
	c := startCluster(t, "egret-test", true)
	n := c.n

	start := time.Now()
	n.ImportEgret(t, egretImage)
	t.Logf("egret image built and imported in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	n.Kubectl(t, "apply", "-k", filepath.Join(repoRoot(), "deploy", "kubernetes"))
	ap := c.waitAgentReady(t, 2*time.Minute, nil)
	t.Logf("install: kubectl apply -k deploy/kubernetes to a Ready agent (%s) in %v", ap.Name, time.Since(start).Round(time.Millisecond))

	ok := t.Run("RetryThroughOptedInPod", c.testRetry)
	ok = t.Run("PodIdentity", c.testIdentity) && ok
	t.Run("KubectlEgret", c.testKubectlEgret)
	t.Run("Lifecycle", func(t *testing.T) {
		t.Run("OptInAndOutByAnnotation", c.testAnnotation)
		t.Run("InitContainer", c.testInitContainer)
		t.Run("LivenessRestartKeepsPodBehindEgret", c.testLivenessRestart)
		t.Run("NewSandboxKeepsPodBehindEgret", c.testNewSandbox)
		t.Run("HostNetworkRefused", c.testHostNetwork)
		t.Run("AmbiguousEventOnTheRightPod", c.testAmbiguousEvent)
		t.Run("Burst30", c.testBurst)
	})
	t.Run("Restarts", c.testRestarts)
	t.Run("Uninstall", c.testUninstall)
}

func (c *cluster) testRetry(t *testing.T) {
	c.newPod(t, "client", []string{"pause"}, optIn)
	c.newPod(t, "control", []string{"pause"})
	for _, p := range []string{"client", "control"} {
		c.n.WaitPod(t, c.ns, p, 2*time.Minute, "Ready", kubenode.PodReady)
	}
	c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/client")
	for i := 0; i < 5; i++ {
		c.expectRetried(t, "client")
	}
	c.expectDirect(t, "control")
}

// Pod identity: the admin API, the log and `egret explain` (kubectl exec
// into the agent, as a person would) name the pod the request came from.
func (c *cluster) testIdentity(t *testing.T) {
	r := c.expectRetried(t, "client")
	id := r.headers["Egret-Request-Id"]
	if id == "" {
		t.Fatal("no Egret-Request-Id")
	}
	ap := c.agentPod(t)
	pods, err := c.agentPods(t, ap)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := pods[c.ns+"/client"]; !ok || s.State != "running" {
		t.Fatalf("admin API /pods: %v", pods)
	}
	out, err := c.n.KubectlErr("exec", "-n", egretNS, ap.Name, "--", "/egret", "explain", "-o", "table", "--admin", "/run/egret/agent.sock", id)
	if err != nil {
		t.Fatalf("egret explain: %v\n%s", err, out)
	}
	if want := "from pod " + c.ns + "/client"; !strings.Contains(out, want) {
		t.Fatalf("egret explain %s: %q lacks %q", id, out, want)
	}
	waitFor(t, 10*time.Second, "the request's log line", func() bool {
		for _, l := range c.agentLogLines(ap, "request") {
			if l["id"] == id {
				if l["pod"] != c.ns+"/client" {
					t.Fatalf("log line names pod %v", l["pod"])
				}
				return true
			}
		}
		return false
	})
}

func (c *cluster) testAnnotation(t *testing.T) {
	c.newPod(t, "annot", []string{"pause"})
	c.n.WaitPod(t, c.ns, "annot", time.Minute, "Ready", kubenode.PodReady)
	c.expectDirect(t, "annot")
	c.n.Kubectl(t, "annotate", "-n", c.ns, "pod/annot", "egret.dev/enabled=true")
	c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/annot")
	c.expectRetried(t, "annot")
	c.n.Kubectl(t, "annotate", "-n", c.ns, "pod/annot", "egret.dev/enabled-")
	c.waitBehindEgret(t, false, 30*time.Second, c.ns+"/annot")
	c.expectDirect(t, "annot")
	c.deletePod(t, "annot")
}

// An init container's connects are redirected: the pod is put behind
// egret while Pending, once its sandbox is up.
func (c *cluster) testInitContainer(t *testing.T) {
	id := kubenode.RandName("init-")
	c.newPod(t, "withinit", []string{"pause"}, optIn, func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{
			Name: "init", Image: kubenode.ToolsImage, ImagePullPolicy: corev1.PullNever,
			// The agent takes the pod once its sandbox is up, which may
			// be after the init container started: it asks (without a
			// fault) until egret answers, then sends the request.
			Command: []string{"/testbin", "get-until-egret", c.ledURL + "/hello", "Ledger-Id: " + id, "Ledger-Fault: 503; times=1"},
		}}
	})
	c.n.WaitPod(t, c.ns, "withinit", 2*time.Minute, "Ready", kubenode.PodReady)
	log := c.n.ContainerLog(c.ns, "withinit", "init")
	if !strings.Contains(log, "Egret-Attempts: 2") {
		t.Fatalf("init container's answer did not come through egret:\n%s", log)
	}
	if n := c.led.Executions(id); n != 2 {
		t.Fatalf("ledger executed the init container's request %d times, want 2 (one 503, one retry)", n)
	}
	c.deletePod(t, "withinit")
}

// A container restarted by its liveness probe (same sandbox, new
// container) stays behind egret.
func (c *cluster) testLivenessRestart(t *testing.T) {
	c.newPod(t, "live", []string{"pause"}, optIn, func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		ct := &p.Spec.Containers[0]
		ct.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		ct.LivenessProbe = &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/testbin", "probe-once", "/data/failed"}}},
			PeriodSeconds:    1,
			FailureThreshold: 1,
		}
	})
	p := c.n.WaitPod(t, c.ns, "live", 2*time.Minute, "restarted by its liveness probe and Ready", func(p *corev1.Pod) bool {
		return kubenode.PodReady(p) && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1
	})
	t.Logf("restarts: %d", p.Status.ContainerStatuses[0].RestartCount)
	c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/live")
	c.expectRetried(t, "live")
	c.deletePod(t, "live")
}

// A pod deleted and made again under the same name (a new sandbox, a new
// cgroup) is behind egret again.
func (c *cluster) testNewSandbox(t *testing.T) {
	var cgs []string
	for i := 0; i < 2; i++ {
		p := c.newPod(t, "again", []string{"pause"}, optIn)
		c.n.WaitPod(t, c.ns, "again", time.Minute, "Ready", kubenode.PodReady)
		c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/again")
		c.expectRetried(t, "again")
		pods, err := c.agentPods(t, c.agentPod(t))
		if err != nil {
			t.Fatal(err)
		}
		cgs = append(cgs, pods[c.ns+"/again"].Cgroup)
		if !strings.Contains(cgs[i], strings.ReplaceAll(string(p.UID), "-", "")) && !strings.Contains(cgs[i], string(p.UID)) {
			t.Errorf("pod %s (uid %s) behind egret with cgroup %s", p.Name, p.UID, cgs[i])
		}
		c.deletePod(t, "again")
	}
	if cgs[0] == cgs[1] {
		t.Fatalf("the recreated pod has the old cgroup %s", cgs[0])
	}
}

func (c *cluster) testHostNetwork(t *testing.T) {
	c.newPod(t, "hostnet", []string{"pause"}, optIn, func(p *corev1.Pod) { p.Spec.HostNetwork = true })
	c.n.WaitPod(t, c.ns, "hostnet", time.Minute, "Ready", kubenode.PodReady)
	waitFor(t, 30*time.Second, "a Warning Event EgretHostNetwork on the pod", func() bool {
		return len(c.events(t, c.ns, "hostnet", "EgretHostNetwork")) > 0
	})
	pods, err := c.agentPods(t, c.agentPod(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pods[c.ns+"/hostnet"]; ok {
		t.Fatal("a hostNetwork pod is behind egret")
	}
	c.deletePod(t, "hostnet")
}

// A POST whose upstream resets after reading it is ambiguous: the client
// is told so, and an Event says so on that pod and no other.
func (c *cluster) testAmbiguousEvent(t *testing.T) {
	out := c.exec(t, "client", "get", "-X", "POST", "-d", "pay=1", c.ledURL+"/pay", "Ledger-Id: "+kubenode.RandName("amb-"), "Ledger-Fault: reset-after-read")
	r := parseResponse(t, out)
	if r.headers["Egret-Outcome"] != "ambiguous" {
		t.Fatalf("POST reset after read: %s %v", r.status, r.headers)
	}
	id := r.headers["Egret-Request-Id"]
	waitFor(t, 30*time.Second, "a Warning Event EgretAmbiguous on pod client", func() bool {
		for _, e := range c.events(t, c.ns, "client", "EgretAmbiguous") {
			if strings.Contains(e.Message, id) && e.InvolvedObject.Kind == "Pod" && e.Type == corev1.EventTypeWarning {
				return true
			}
		}
		return false
	})
	if ev := c.events(t, c.ns, "control", "EgretAmbiguous"); len(ev) != 0 {
		t.Fatalf("Event on the wrong pod: %v", ev)
	}
}

// 30 pods created and deleted at once: every one is put behind egret, and
// afterwards nothing of them is left in the agent, its pins or its maps.
func (c *cluster) testBurst(t *testing.T) {
	ap := c.agentPod(t)
	pin := filepath.Join(c.n.Root(), "sys", "fs", "bpf", "egret")
	before := pinnedPods(t, pin)
	entriesBefore := mapEntries(t, filepath.Join(pin, "egret_pods"))
	fdsBefore, fdKindsBefore := agentFDs(t, c, ap), fdKinds(t, c, ap)
	var names []string
	var wg sync.WaitGroup
	for i := 0; i < 30; i++ {
		name := fmt.Sprintf("burst-%02d", i)
		names = append(names, c.ns+"/"+name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.newPod(t, name, []string{"pause"}, optIn, func(p *corev1.Pod) { p.Labels["burst"] = "yes" })
		}()
	}
	wg.Wait()
	start := time.Now()
	c.waitBehindEgret(t, true, 3*time.Minute, names...)
	t.Logf("30 pods behind egret %v after their creation", time.Since(start).Round(time.Millisecond))
	if got := len(pinnedPods(t, pin)) - len(before); got != 30 {
		t.Errorf("pinned pod links: %d more, want 30", got)
	}
	zero := int64(0)
	if err := c.n.Client.CoreV1().Pods(c.ns).DeleteCollection(c.ctx(), metav1.DeleteOptions{GracePeriodSeconds: &zero},
		metav1.ListOptions{LabelSelector: "burst=yes"}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	c.waitBehindEgret(t, false, 3*time.Minute, names...)
	t.Logf("30 pods off egret %v after their deletion", time.Since(start).Round(time.Millisecond))
	var links, entries, fds int
	// Polls the kernel's pins and the agent's descriptors, which announce
	// nothing.
	if !testenv.Poll(30*time.Second, func() bool {
		links, entries, fds = len(pinnedPods(t, pin)), mapEntries(t, filepath.Join(pin, "egret_pods")), agentFDs(t, c, ap)
		return links == len(before) && entries == entriesBefore && fds <= fdsBefore
	}) {
		t.Fatalf("30 s after the burst: %d pinned pod links (before %d), %d egret_pods entries (before %d), %d agent descriptors (before %d: %v; now %v)",
			links, len(before), entries, entriesBefore, fds, fdsBefore, fdKindsBefore, fdKinds(t, c, ap))
	}
	for _, n := range names {
		c.n.WaitPod(t, c.ns, strings.TrimPrefix(n, c.ns+"/"), time.Minute, "gone", func(p *corev1.Pod) bool { return p == nil })
	}
}

func pinnedPods(t testing.TB, pin string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(pin, "links", "pod"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func mapEntries(t testing.TB, path string) int {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var k uint64
	var v []byte
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// agentFDs counts the agent process's open descriptors.
func agentFDs(t testing.TB, c *cluster, ap *corev1.Pod) int {
	t.Helper()
	pid := agentPID(t, c, ap)
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// fdKinds counts the agent's descriptors by what they are (socket,
// anon_inode:bpf-map, a path), for a message.
func fdKinds(t testing.TB, c *cluster, ap *corev1.Pod) map[string]int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", agentPID(t, c, ap))
	ents, _ := os.ReadDir(dir)
	out := map[string]int{}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if i := strings.IndexAny(l, ":["); i > 0 && !strings.HasPrefix(l, "/") {
			l = l[:i]
		}
		out[l]++
	}
	return out
}

// agentPID finds the agent's process: the one whose command line is
// /egret agent, in the agent pod's cgroup.
func agentPID(t testing.TB, c *cluster, ap *corev1.Pod) int {
	t.Helper()
	uid := strings.ReplaceAll(string(ap.UID), "-", "_")
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if !strings.HasPrefix(string(cmd), "/egret\x00agent\x00") {
			continue
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if strings.Contains(string(cg), string(ap.UID)) || strings.Contains(string(cg), uid) {
			return pid
		}
	}
	t.Fatalf("no /egret agent process in pod %s's cgroup", ap.Name)
	return 0
}

// restartKind is a way the agent's pod or container goes and comes back.
type restartKind struct {
	name string
	// killed: the agent gets no chance to stop (SIGKILL). The request in
	// flight through it at that instant dies with it: at most one failed
	// request per kill, and never a hang. A connect the kernel had queued
	// on a pod's listener (or was about to) is not lost: egret keeper
	// holds the listener and the next agent serves it, so with the keeper
	// in the DaemonSet no connect may fail. Without it such a connect is
	// reset with the listener, and counts against the same one failure.
	killed bool
	// do makes the restart happen to the current agent pod and returns a
	// test for the new agent pod (a new pod, or the same pod with its
	// container restarted).
	do func(t *testing.T, c *cluster, ap *corev1.Pod, round int) func(*corev1.Pod) bool
}

func containerRestarted(ap *corev1.Pod) func(*corev1.Pod) bool {
	before, _ := agentRestarts(ap)
	return func(p *corev1.Pod) bool {
		n, ok := agentRestarts(p)
		return p.UID == ap.UID && ok && n > before
	}
}

// agentRestarts is the restart count of the agent's container (the pod
// has egret keeper's too).
func agentRestarts(p *corev1.Pod) (int32, bool) {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == "agent" {
			return cs.RestartCount, true
		}
	}
	return 0, false
}

func newPodThan(ap *corev1.Pod) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool { return p.UID != ap.UID }
}

var restartKinds = []restartKind{
	{"DeletePod", false, func(t *testing.T, c *cluster, ap *corev1.Pod, _ int) func(*corev1.Pod) bool {
		c.n.Kubectl(t, "delete", "pod", "-n", egretNS, ap.Name, "--wait=false")
		return newPodThan(ap)
	}},
	// The agent's process exits on SIGTERM (as it does when the runtime
	// stops the container): the kubelet restarts the container in the
	// same pod, in a new container cgroup.
	{"ContainerStopped", false, func(t *testing.T, c *cluster, ap *corev1.Pod, _ int) func(*corev1.Pod) bool {
		if err := syscall.Kill(agentPID(t, c, ap), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		return containerRestarted(ap)
	}},
	// SIGKILL, as the kernel's OOM killer sends it: no clean-up at all.
	{"OOMStyleKill", true, func(t *testing.T, c *cluster, ap *corev1.Pod, _ int) func(*corev1.Pod) bool {
		if err := syscall.Kill(agentPID(t, c, ap), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		return containerRestarted(ap)
	}},
	// A rolling update to another image (built and imported under a new
	// tag each round).
	{"RollingUpdate", false, func(t *testing.T, c *cluster, ap *corev1.Pod, round int) func(*corev1.Pod) bool {
		img := fmt.Sprintf("%s-r%d", egretImage, round)
		c.n.ImportEgret(t, img)
		c.n.Kubectl(t, "set", "image", "-n", egretNS, "daemonset/egret", "agent="+img)
		return func(p *corev1.Pod) bool { return p.UID != ap.UID && p.Spec.Containers[0].Image == img }
	}},
}

// Five restarts of each kind while a client in an opted-in pod asks the
// upstream every 20 ms on a new connection each time: no connect fails and
// no request hangs; requests go direct during the gap; the new agent
// adopts the running pods and the client is behind egret again.
func (c *cluster) testRestarts(t *testing.T) {
	loop := c.newPod(t, "loop", []string{"loop", "-url", c.ledURL + "/loop", "-interval", "20ms", "-timeout", "5s"}, optIn,
		func(p *corev1.Pod) {
			p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/stats", Port: intstr.FromInt32(8080)}},
				PeriodSeconds: 1,
			}
		})
	loop = c.n.WaitPod(t, c.ns, loop.Name, time.Minute, "Ready", kubenode.PodReady)
	ip := loop.Status.PodIP
	c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/loop")
	c.waitLoopViaEgret(t, ip, time.Now(), 10*time.Second)
	pin := filepath.Join(c.n.Root(), "sys", "fs", "bpf", "egret")

	type result struct {
		kind                       string
		gaps                       []float64
		requests, connectFails     int
		hung, failed, adoptedTotal int
	}
	var results []result
	for _, k := range restartKinds {
		t.Run(k.name, func(t *testing.T) {
			res := result{kind: k.name}
			for round := 1; round <= 5; round++ {
				ap := c.waitAgentReady(t, 2*time.Minute, nil)
				kept := false
				for _, ct := range ap.Spec.Containers {
					kept = kept || ct.Name == "keeper"
				}
				if k.killed && round == 1 {
					t.Logf("egret keeper in the agent's pod: %v", kept)
				}
				c.loop(t, ip, "reset")
				// The old agent's log, open before the kubelet removes it
				// with its pod: a long gap is explained from both logs.
				oldLogs := c.n.OpenContainerLog(egretNS, ap.Name, "agent")
				before := time.Now()
				isNew := k.do(t, c, ap, round)
				nap := c.waitAgentReady(t, 3*time.Minute, isNew)
				c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/loop", c.ns+"/client")
				back := time.Now()
				// Five more answers through egret, then read: the gap's
				// run of direct answers is closed by then.
				s := c.waitLoopViaEgret(t, ip, back, 30*time.Second)
				for first := s.ViaEgret; s.ViaEgret < first+5; {
					s = c.waitLoopViaEgret(t, ip, s.LastEgret, 30*time.Second)
				}
				gap := 0.0
				for _, r := range s.DirectRuns {
					if r.GapMS > gap {
						gap = r.GapMS
					}
				}
				res.gaps = append(res.gaps, gap)
				res.requests += s.Requests
				res.connectFails += s.FailedConnects
				res.hung += s.Hung
				res.failed += s.FailedRequests
				adopted := -1
				for _, l := range c.agentLogLines(nap, "egret agent running") {
					if v, ok := l["adopted_pods"].(float64); ok {
						adopted = int(v)
					}
				}
				res.adoptedTotal += adopted
				t.Logf("round %d: %v to a Ready agent; gap %.0f ms; %d requests (%d via egret, %d direct), %d failed connects, %d hung, %d failed; adopted %d pods",
					round, time.Since(before).Round(time.Millisecond), gap, s.Requests, s.ViaEgret, s.Direct, s.FailedConnects, s.Hung, s.FailedRequests, adopted)
				// One restart starts one agent process: a crash of the
				// new one is a gap of its own.
				was, _ := agentRestarts(ap)
				now, _ := agentRestarts(nap)
				if want := was + 1; nap.UID != ap.UID && now != 0 || nap.UID == ap.UID && now != want {
					t.Errorf("round %d: the agent container's restart count went from %d to %d (want %d in the same pod, 0 in a new one): the new agent crashed before it was Ready",
						round, was, now, want)
				}
				if gap > 10_000 {
					t.Logf("round %d: a gap of %.0f ms; what the agents logged from %s:\n%s", round, gap,
						before.UTC().Format(time.RFC3339Nano), restartTimeline(before, oldLogs, c.n.ContainerLog(egretNS, nap.Name, "agent")))
				}
				for _, f := range oldLogs {
					f.Close()
				}
				if took := time.Since(before); gap > float64((took + 5*time.Second).Milliseconds()) {
					t.Errorf("round %d: the pod went direct for %.0f ms, longer than the restart took (%v) and 5 s", round, gap, took)
				}
				switch {
				case s.Hung != 0:
					t.Errorf("round %d: %d hung requests (want 0): %v", round, s.Hung, s.Errors)
				case !k.killed && s.FailedConnects+s.FailedRequests != 0:
					t.Errorf("round %d: %d failed connects, %d failed requests (want 0): %v", round, s.FailedConnects, s.FailedRequests, s.Errors)
				case k.killed && kept && s.FailedConnects != 0:
					t.Errorf("round %d: %d failed connects with egret keeper holding the listeners (want 0): %v", round, s.FailedConnects, s.Errors)
				case k.killed && kept && s.FailedRequests > 2:
					// The request the killed agent was serving, and a
					// connect queued on its listener when the new agent
					// takes longer than the keeper's hold (reset then,
					// rather than left hanging).
					t.Errorf("round %d: %d failed requests (want at most the one in flight at the kill and one queued past the keeper's hold): %v", round, s.FailedRequests, s.Errors)
				case k.killed && !kept && s.FailedConnects+s.FailedRequests > 1:
					t.Errorf("round %d: %d failed connects, %d failed requests (want at most the one in flight at the kill): %v", round, s.FailedConnects, s.FailedRequests, s.Errors)
				}
				if adopted < 2 {
					t.Errorf("round %d: the new agent adopted %d pods, want the 2 running ones (client, loop) at least", round, adopted)
				}
				if !fileExists(filepath.Join(pin, "egret_pods")) {
					t.Fatalf("round %d: a restart removed the pinned state", round)
				}
				c.expectRetried(t, "client")
			}
			sort.Float64s(res.gaps)
			t.Logf("%s x5: gaps %v ms (median %.0f); %d requests, %d failed connects, %d hung, %d failed in flight",
				k.name, res.gaps, res.gaps[2], res.requests, res.connectFails, res.hung, res.failed)
			results = append(results, res)
		})
	}
	for _, r := range results {
		t.Logf("restart %-17s gaps (ms) %v; requests %d; failed connects %d; hung %d; failed in flight %d",
			r.kind, r.gaps, r.requests, r.connectFails, r.hung, r.failed)
	}
}

// kubectl delete -k deploy/kubernetes removes every egret program, link,
// pin and map from the node, and pods connect direct.
func (c *cluster) testUninstall(t *testing.T) {
	ap := c.agentPod(t)
	pin := filepath.Join(c.n.Root(), "sys", "fs", "bpf", "egret")
	var mapIDs []ebpf.MapID
	for _, name := range []string{"egret_pods", "egret_tuples", "egret_globals"} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pin, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		mapIDs = append(mapIDs, id)
		m.Close()
	}
	pods, err := c.agentPods(t, ap)
	if err != nil {
		t.Fatal(err)
	}
	var cgroups []string
	var progs []uint32
	for _, p := range pods {
		cg := filepath.Join(c.n.Root(), p.Cgroup)
		ids, err := bpftest.AttachedPrograms(cg)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) == 0 {
			t.Fatalf("pod %s: nothing attached to %s before the uninstall", p.Name, p.Cgroup)
		}
		cgroups = append(cgroups, cg)
		progs = append(progs, ids...)
	}
	// The agent's log to its end, as a person would watch it (the kubelet
	// removes a pod's log files with the pod).
	follow := c.n.KubectlCommand(c.ctx(), "logs", "-f", "-n", egretNS, ap.Name, "-c", "agent")
	var logBuf strings.Builder
	follow.Stdout = &logBuf
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.n.Kubectl(t, "delete", "-k", filepath.Join(repoRoot(), "deploy", "kubernetes"), "--wait=true")
	waitFor(t, 2*time.Minute, "the agent pod gone", func() bool { return c.agentPod(t) == nil })
	followed := make(chan error, 1)
	go func() { followed <- follow.Wait() }()
	select {
	case <-followed:
	case <-time.After(30 * time.Second):
		follow.Process.Kill()
		<-followed
	}
	agentLog := logBuf.String()
	t.Logf("kubectl delete -k: agent gone in %v", time.Since(start).Round(time.Millisecond))
	var left []string
	if fileExists(pin) {
		left = append(left, "pin directory "+pin)
	}
	for _, id := range mapIDs {
		if m, err := ebpf.NewMapFromID(id); err == nil {
			m.Close()
			left = append(left, fmt.Sprintf("map %d", id))
		}
	}
	for _, cg := range cgroups {
		ids, err := bpftest.AttachedPrograms(cg)
		if err == nil && len(ids) > 0 {
			left = append(left, fmt.Sprintf("programs %v on %s", ids, cg))
		}
	}
	waitFor(t, 10*time.Second, "egret's programs unloaded", func() bool {
		for _, id := range progs {
			if bpftest.ProgExists(id) {
				return false
			}
		}
		return true
	})
	if len(left) > 0 {
		t.Fatalf("left on the node after the uninstall: %s", strings.Join(left, ", "))
	}
	uninstalled := false
	for _, l := range logLines(agentLog, "egret is being uninstalled: removing its eBPF state") {
		uninstalled = true
		t.Logf("agent: %v", l["why"])
	}
	if !uninstalled {
		t.Errorf("the agent's log (%d bytes) does not say it took the stop for an uninstall:\n%s", len(agentLog), tailLines(agentLog, 20))
	}
	out, err := c.n.KubectlErr("exec", "-n", c.ns, "client", "-c", "c", "--", "/testbin", "get", c.ledURL+"/hello", "Ledger-Id: after-"+kubenode.RandName(""))
	if err != nil {
		// Debug: every pod namespace's sockets.
		nss, _ := os.ReadDir(filepath.Join(c.n.Root(), "run", "netns"))
		for _, ns := range nss {
			b, _ := c.n.Command(c.ctx(), "ip", "netns", "exec", ns.Name(), "ss", "-tanp").CombinedOutput()
			t.Logf("netns %s:\n%s", ns.Name(), b)
		}
		hc := c.n.HTTPClient(3 * time.Second)
		resp, herr := hc.Get(c.ledURL + "/hello")
		if resp != nil {
			resp.Body.Close()
		}
		t.Fatalf("after the uninstall: %v\n%s\n(the ledger from the node: %v)", err, out, herr)
	}
	c.expectDirect(t, "client")
}

// restartTimeline is the old agent's log from since on, then the new
// agent's first lines: time and message of each.
func restartTimeline(since time.Time, oldLogs []*os.File, newLog string) string {
	var b strings.Builder
	on := false // a line at or after since was seen
	line := func(who, l string) {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil {
			// Not the logger's: what the process printed as it exited.
			if on && strings.TrimSpace(l) != "" {
				fmt.Fprintf(&b, "  %s %s\n", who, l)
			}
			return
		}
		ts, _ := m["time"].(string)
		if at, err := time.Parse(time.RFC3339Nano, ts); err == nil && at.Before(since) {
			return
		}
		on = true
		delete(m, "time")
		delete(m, "level")
		msg := m["msg"]
		delete(m, "msg")
		rest, _ := json.Marshal(m)
		fmt.Fprintf(&b, "  %s %s %v %s\n", ts, who, msg, rest)
	}
	for _, f := range oldLogs {
		f.Seek(0, io.SeekStart)
		for _, l := range strings.Split(kubenode.ReadCRILog(f), "\n") {
			line("old", l)
		}
	}
	on = true
	for i, l := range strings.Split(newLog, "\n") {
		if i == 40 {
			break
		}
		line("new", l)
	}
	return b.String()
}
