package cli

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ucli "github.com/urfave/cli/v2"
)

// runApp runs egret in this process and returns the error its command
// ended with (nil for success).
func runApp(t *testing.T, args ...string) error {
	t.Helper()
	app := App()
	app.ExitErrHandler = func(*ucli.Context, error) {}
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	return app.Run(append([]string{"egret"}, args...))
}

func TestAgentTakesExactlyOnePodSource(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	pods := filepath.Join(t.TempDir(), "pods.yaml")
	if err := os.WriteFile(pods, []byte("pods: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"agent"}, "agent needs a pod source: --pods FILE (a pods file) or --kubernetes"},
		{[]string{"agent", "--pods", pods, "--kubernetes"}, "agent takes one pod source: --pods FILE or --kubernetes, not both"},
		{[]string{"agent", "--pods", pods, "--kubeconfig", "/k"}, "--kubeconfig is for --kubernetes"},
		{[]string{"agent", "--pods", pods, "--cgroup-driver", "systemd"}, "--cgroup-driver is for --kubernetes"},
		{[]string{"agent", "--pods", pods, "--kubelet-cgroup-root", "/k"}, "--kubelet-cgroup-root is for --kubernetes"},
		{[]string{"agent", "--kubernetes"}, "--kubernetes needs this node's name: --node-name NAME or NODE_NAME"},
		{[]string{"agent", "--kubernetes", "--node-name", "n", "--cgroup-driver", "docker"}, "--cgroup-driver must be auto, cgroupfs or systemd"},
	}
	for _, c := range cases {
		err := runApp(t, c.args...)
		var ec ucli.ExitCoder
		if !errors.As(err, &ec) || ec.ExitCode() != 2 || err.Error() != c.want && !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("egret %s: %v, want exit 2 %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}

// NODE_NAME names the node when --node-name does not; outside a pod
// without --kubeconfig there is no config to use (as root: the agent gets
// that far; otherwise it says it needs root first).
func TestAgentKubernetesNeedsAConfig(t *testing.T) {
	t.Setenv("NODE_NAME", "node-a")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	err := runApp(t, "agent", "--kubernetes")
	want := "--kubernetes: not running in a pod (KUBERNETES_SERVICE_HOST and _PORT unset); give --kubeconfig FILE"
	if os.Geteuid() != 0 {
		want = "needs root"
	}
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("egret agent --kubernetes: %v, want %q", err, want)
	}
	if os.Geteuid() == 0 {
		err = runApp(t, "agent", "--kubernetes", "--kubeconfig", filepath.Join(t.TempDir(), "missing"))
		if err == nil || !strings.Contains(err.Error(), "--kubeconfig") || !strings.Contains(err.Error(), "missing") {
			t.Fatalf("missing kubeconfig: %v", err)
		}
	}
}
