package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/test/kubeapi"
)

// TestKubectlPluginFindsTheAgent runs the plugin through the real kubectl
// (kubectl egret ...) against a real API server: it finds the running
// agent on a pod's node, or on --node, or says why there is none or which
// nodes to choose from. No kubelet runs, so the exec itself is shown with
// --dry-run; a real exec is refused by the API server, and kubectl's
// status is the plugin's.
func TestKubectlPluginFindsTheAgent(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		testenv.Require(t, false, "kubectl is installed")
	}
	c := kubeapi.Start(t)
	agentNS, appNS := c.Namespace(t), c.Namespace(t)
	ctx := context.Background()
	mkPod := func(ns, name, node string, labels map[string]string, phase corev1.PodPhase) {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "agent", Image: "egret"}}},
		}
		p, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if phase != "" {
			p.Status.Phase = phase
			if _, err := c.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	agentLabels := map[string]string{"app.kubernetes.io/name": "egret", "app.kubernetes.io/component": "agent"}
	mkPod(agentNS, "egret-a", "node-a", agentLabels, corev1.PodRunning)
	mkPod(agentNS, "egret-b", "node-b", agentLabels, corev1.PodRunning)
	mkPod(agentNS, "egret-c", "node-c", agentLabels, corev1.PodPending)
	mkPod(agentNS, "not-egret", "node-d", map[string]string{"app.kubernetes.io/name": "other"}, corev1.PodRunning)
	mkPod(appNS, "web", "node-b", nil, "")
	mkPod(appNS, "lonely", "node-d", nil, "")

	// The plugin is found by kubectl on PATH, as kubectl-egret.
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-egret"), "../../kubectl-egret").CombinedOutput(); err != nil {
		t.Fatalf("go build kubectl-egret: %v\n%s", err, out)
	}
	env := append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+c.Kubeconfig)
	plugin := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(kubectl, append([]string{"egret", "--agent-namespace", agentNS}, args...)...)
		cmd.Env = env
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(o.String()), strings.TrimSpace(e.String()), code
	}
	execLine := func(agent string, egretArgs string) string {
		return "kubectl --kubeconfig " + c.Kubeconfig + " exec -n " + agentNS + " " + agent + " -c agent -- /egret " + egretArgs
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		// explain -n NS POD ID: the agent on web's node, egret gets the id.
		{[]string{"--dry-run", "explain", "-n", appNS, "web", "8e13ac3b035fce95"}, execLine("egret-b", "explain 8e13ac3b035fce95")},
		{[]string{"--dry-run", "explain", "-o", "table", "--namespace=" + appNS, "web", "8e13ac3b035fce95"}, execLine("egret-b", "explain -o table 8e13ac3b035fce95")},
		// top --node N: passed through as it is.
		{[]string{"--dry-run", "--node", "node-a", "top"}, execLine("egret-a", "top")},
		{[]string{"--dry-run", "--pod", "web", "-n", appNS, "observe", "--follow", "-n", "shop"}, execLine("egret-b", "observe --follow -n shop")},
	} {
		out, errOut, code := plugin(tc.args...)
		if code != 0 || out != tc.want {
			t.Errorf("kubectl egret %s: status %d, %q (stderr %q); want %q", strings.Join(tc.args, " "), code, out, errOut, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--dry-run", "status"}, 2, "2 egret agents in the cluster: say which with --node NODE (node-a, node-b)"},
		{[]string{"--dry-run", "--node", "node-c", "status"}, 1, "no egret agent running on node node-c: pod egret-c is Pending"},
		{[]string{"--dry-run", "explain", "-n", appNS, "lonely", "8e13ac3b035fce95"}, 1, "no egret agent on node node-d"},
		{[]string{"--dry-run", "explain", "-n", appNS, "gone", "8e13ac3b035fce95"}, 1, `pod ` + appNS + `/gone: pods "gone" not found`},
		{[]string{"--dry-run"}, 2, "which egret command?"},
		{[]string{"--dry-run", "explain", "-n", appNS}, 2, "explain needs [POD] REQUEST-ID"},
	} {
		out, errOut, code := plugin(tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("kubectl egret %s: status %d, stderr %q, stdout %q; want status %d and %q", strings.Join(tc.args, " "), code, errOut, out, tc.code, tc.want)
		}
	}
	// Without --dry-run kubectl runs the exec; with no node object nor
	// kubelet behind node-a the API server refuses it, and kubectl's
	// failure is ours.
	if out, errOut, code := plugin("--node", "node-a", "status"); code == 0 || errOut == "" {
		t.Errorf("kubectl egret --node node-a status with no kubelet: status %d, %q %q", code, out, errOut)
	} else {
		t.Logf("the exec, refused without a kubelet: status %d, %s", code, errOut)
	}
}
