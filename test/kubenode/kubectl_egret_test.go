package kubenode_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// testKubectlEgret runs the kubectl plugin as a person would, through
// kubectl (the plugin on PATH, the node's admin kubeconfig): explain by the
// client pod and the request id, status on the agent's node, observe by
// the client pod's node.
func (c *cluster) testKubectlEgret(t *testing.T) {
	r := c.expectRetried(t, "client")
	id := r.headers["Egret-Request-Id"]
	if id == "" {
		t.Fatal("no Egret-Request-Id")
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-egret"), "./cmd/kubectl-egret")
	build.Dir = repoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build kubectl-egret: %v\n%s", err, out)
	}
	plugin := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// kubectl finds a plugin only when no flag comes before its
		// name: the kubeconfig goes in KUBECONFIG.
		cmd := c.n.KubectlCommand(ctx)
		pre := cmd.Args[:slices.Index(cmd.Args, "--")+1]
		cmd.Args = append(append(append([]string{}, pre...), "env", "PATH="+dir+":"+os.Getenv("PATH"), "KUBECONFIG="+c.n.Kubeconfig, "kubectl", "egret"), args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("kubectl egret %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		return stdout.String()
	}
	if out, want := plugin("explain", "-n", c.ns, "client", "-o", "table", id), "from pod "+c.ns+"/client"; !strings.Contains(out, want) {
		t.Errorf("kubectl egret explain -n %s client %s: %q lacks %q", c.ns, id, out, want)
	}
	ap := c.agentPod(t)
	if out := plugin("--node", ap.Spec.NodeName, "status", "-o", "json"); !strings.Contains(out, `"kernel"`) || !strings.Contains(out, `"ebpf"`) {
		t.Errorf("kubectl egret --node %s status: %s", ap.Spec.NodeName, out)
	}
	if out := plugin("--pod", "client", "-n", c.ns, "observe", "-o", "json", "--pod", c.ns+"/client"); !strings.Contains(out, `"request_id":"`+id+`"`) {
		t.Errorf("kubectl egret observe --pod %s/client lacks request %s:\n%s", c.ns, id, out)
	}
}
