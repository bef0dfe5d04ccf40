package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/pods/kube"
	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/test/kubeapi"
)

// agentRBAC is what the agent may do on the API server: read the pods
// (of its node, by field selector) and write Events about them.
var agentRBAC = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
}

// TestKubernetesAgent runs the real `egret agent --kubernetes` against a
// real kube-apiserver, as a service account held by RBAC to agentRBAC. A
// pod object on the agent's node, opted in by annotation, stands for a
// test pod (cgroup in the kubelet's layout, network namespace, a process):
// its curl is answered through egret and retried; a second pod with a bad
// annotation is left out, logged and given a Warning Event; the annotation
// removed, the pod's connects go direct.
func TestKubernetesAgent(t *testing.T) {
	testenv.RequireRoot(t)
	c := kubeapi.StartWith(t, kubeapi.Options{RBAC: true})
	ctx := context.Background()

	// The agent's identity and role.
	const sa = "system:serviceaccount:egret:egret-agent"
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "egret-agent"}, Rules: agentRBAC,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "egret-agent"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "egret-agent"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "egret", Name: "egret-agent"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := c.KubeconfigAs(t, sa, "system:serviceaccounts", "system:authenticated")

	name := Prefix + randHex(4)
	top := filepath.Join(cgroup2.Root(), name) // the agent's --cgroup-root
	pin := filepath.Join(bpfload.BPFFSRoot, name)
	t.Cleanup(func() {
		removeCgroupTree(t, top)
		assertNothingLeft(t, name, nil)
	})
	node := "node-" + randHex(4)
	ns := c.Namespace(t)
	pods := c.Client.CoreV1().Pods(ns)
	newPod := func(podName string, ann map[string]string) *corev1.Pod {
		t.Helper()
		obj, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: podName, Annotations: ann},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// No kubelet: the test says the pod runs.
		obj.Status.Phase = corev1.PodRunning
		if obj, err = pods.UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if obj.Status.QOSClass != corev1.PodQOSBestEffort {
			t.Fatalf("pod %s: QoS %q, want BestEffort", podName, obj.Status.QOSClass)
		}
		return obj
	}
	web := newPod("web", map[string]string{kube.AnnotationEnabled: "true", kube.AnnotationExcludePorts: "9"})
	newPod("bad", map[string]string{kube.AnnotationEnabled: "true", kube.AnnotationExcludeCIDRs: "10.0.0.300/8"})

	// What the kubelet and the runtime would have made for web: its cgroup
	// in the cgroupfs layout, a namespace joined to the host by a veth,
	// and a process in both.
	p := makePod(t, filepath.Join(top, "kubepods", "besteffort"), "pod"+string(web.UID), podOpts{})
	sleep := p.command("sleep", "600")
	if err := p.start(sleep); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleep.Process.Kill(); sleep.Wait() })
	led, up := startLedger(t, p.host4)

	admin := filepath.Join(t.TempDir(), "admin.sock")
	a := startAgent(t, "--kubernetes", "--kubeconfig", kubeconfig, "--node-name", node, "--cgroup-root", top,
		"--cgroup-driver", "cgroupfs", "--pin-dir", pin, "--cgroup", filepath.Join(top, "egret"), "--admin", admin, "--cleanup")
	podName := ns + "/web"
	a.waitRunning(t, podName)
	st := podStatus(t, admin, podName)
	if st.Cgroup != p.cgroup || st.Netns != p.ns.Path() {
		t.Fatalf("agent's pod: cgroup %q netns %q, want %q %q", st.Cgroup, st.Netns, p.cgroup, p.ns.Path())
	}
	log := a.log.String()
	for _, want := range []string{"pods_from=kubernetes", "node=" + node, "server_version=v1.36.3"} {
		if !strings.Contains(log, want) {
			t.Errorf("agent log lacks %q:\n%s", want, log)
		}
	}

	// A plain curl in the pod: through egret, retried.
	r := p.curl(t, "-H", "Ledger-Id: kube-1", "-H", "Ledger-Fault: 503; times=1", url(up, "/orders"))
	if r.Status != 200 || r.Headers.Get("Egret-Request-Id") == "" || attempts(r) != 2 {
		t.Fatalf("curl through egret: status %d, headers %v", r.Status, r.Headers)
	}
	if n := led.Executions("kube-1"); n != 2 {
		t.Fatalf("ledger executions %d, want 2", n)
	}
	t.Logf("pod %s (cgroup %s, netns %s) behind egret: 503 then 200, Egret-Attempts %s, Egret-Request-Id %s",
		podName, st.Cgroup, st.Netns, r.Headers.Get("Egret-Attempts"), r.Headers.Get("Egret-Request-Id"))

	// The bad pod: left out, in the agent's log, and a Warning Event the
	// agent wrote (as its service account).
	if st := podStatus(t, admin, ns+"/bad"); st.State != "" {
		t.Fatalf("bad pod known to the agent: %+v", st)
	}
	ev := waitEvent(t, c, ns, "bad", kube.ReasonBadAnnotation)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, `egret.dev/exclude-cidrs="10.0.0.300/8"`) {
		t.Fatalf("event: %+v", ev)
	}
	// (The agent batches its log lines: wait for their write.)
	if !a.log.Await(10*time.Second, func(log string) bool {
		return strings.Contains(log, `msg="pod source refused" err="pod `+ns+`/bad: annotation egret.dev/exclude-cidrs`)
	}) {
		t.Fatalf("agent log lacks the bad annotation:\n%s", a.log.String())
	}
	t.Logf("Warning Event on %s/bad: %s", ns, ev.Message)

	// The annotation removed: the pod goes, its connects go direct (the
	// ledger's 503 reaches the client, nothing retries it).
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{kube.AnnotationEnabled: nil}}})
	if _, err := pods.Patch(ctx, "web", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if !a.log.Await(15*time.Second, func(log string) bool { return strings.Contains(log, `msg="pod removed" pod=`+podName) }) {
		t.Fatalf("pod not removed after its annotation went:\n%s", a.log.String())
	}
	r = p.curl(t, "-H", "Ledger-Id: kube-2", "-H", "Ledger-Fault: 503; times=1", url(up, "/orders"))
	if r.Status != 503 || r.Headers.Get("Egret-Request-Id") != "" || led.Executions("kube-2") != 1 {
		t.Fatalf("after opt-out: status %d, headers %v, executions %d; want a direct 503", r.Status, r.Headers, led.Executions("kube-2"))
	}

	// SIGTERM with --cleanup removes what the agent made.
	a.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.cmd.Wait(); err != nil {
		t.Errorf("agent exit: %v\n%s", err, a.log.String())
	}
}

// podStatus asks the agent's admin API about one pod (zero if unknown).
func podStatus(t *testing.T, admin, name string) agent.PodStatus {
	t.Helper()
	c := agent.AdminClient(admin)
	defer c.CloseIdleConnections() // or each call leaves one of the agent's descriptors held
	resp, err := c.Get("http://egret/pods/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st agent.PodStatus
	if resp.StatusCode == 200 {
		_ = json.NewDecoder(resp.Body).Decode(&st)
	}
	return st
}

// waitEvent polls the API for an Event with the reason on a pod.
func waitEvent(t *testing.T, c *kubeapi.Cluster, ns, pod, reason string) corev1.Event {
	t.Helper()
	var ev corev1.Event
	// Polls the API server for the Event (a watch would do, at the
	// price of its own resync handling).
	testenv.Eventually(t, 15*time.Second, "Event "+reason+" on pod "+ns+"/"+pod, func() bool {
		l, err := c.Client.CoreV1().Events(ns).List(context.Background(),
			metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=" + reason})
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
