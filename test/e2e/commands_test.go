package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/test/ledger"
)

// TestEgretRunCurl: `egret run -- curl http://127.0.0.1:PORT/` on one
// machine, no Kubernetes: curl knows nothing of egret and its answer
// carries Egret-Attempts.
func TestEgretRunCurl(t *testing.T) {
	testenv.RequireRoot(t)
	nothingLeftByRun(t)
	bin := egretBinary(t)
	led, up := startLedgerLoopback(t)
	cmd := exec.Command(bin, "run", "--", "curl", "-sS", "-i", "-H", "Ledger-Id: run-1", "-H", "Ledger-Fault: 503; times=1", url(up, "/hello"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("egret run: %v\n%s", err, stderr.String())
	}
	t.Logf("$ sudo egret run -- curl -sS -i -H 'Ledger-Id: run-1' -H 'Ledger-Fault: 503; times=1' %s\n%s%s", url(up, "/hello"), stdout.String(), stderr.String())
	r := parseHTTP(t, stdout.String())
	if r.Status != 200 || attempts(r) != 2 || led.Executions("run-1") != 2 {
		t.Fatalf("status %d attempts %q executions %d", r.Status, r.Headers.Get("Egret-Attempts"), led.Executions("run-1"))
	}

	// --policy: a node policy for the command's requests.
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("defaults:\n  max_attempts: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "run", "-q", "--policy", pol, "--", "curl", "-sS", "-i", "-H", "Ledger-Id: run-p", "-H", "Ledger-Fault: 503; times=1", url(up, "/")).Output()
	if err != nil {
		t.Fatalf("egret run --policy: %v", err)
	}
	if r := parseHTTP(t, string(out)); r.Status != 503 || attempts(r) != 1 || led.Executions("run-p") != 1 {
		t.Fatalf("--policy max_attempts 1: status %d attempts %d", r.Status, attempts(r))
	}

	// --netns new: a namespace of its own, joined to the host by a veth
	// whose host end is in $EGRET_HOST; the exit status is the command's.
	led2, up2 := startLedger(t, netip.IPv4Unspecified())
	self, _ := os.Readlink("/proc/self/ns/net")
	script := fmt.Sprintf(`readlink /proc/self/ns/net; curl -sS -i -H "Ledger-Id: run-2" -H "Ledger-Fault: 503; times=1" http://$EGRET_HOST:%d/; exit 3`, up2.Port())
	cmd = exec.Command(bin, "run", "-q", "--netns", "new", "--", "sh", "-c", script)
	stdout.Reset()
	stderr.Reset()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("exit status: %v\n%s", err, stderr.String())
	}
	ns, resp, _ := strings.Cut(stdout.String(), "\n")
	if ns == self || !strings.HasPrefix(ns, "net:") {
		t.Fatalf("--netns new ran in %q (egret's is %q)", ns, self)
	}
	r = parseHTTP(t, resp)
	if r.Status != 200 || attempts(r) != 2 || led2.Executions("run-2") != 2 {
		t.Fatalf("--netns new: status %d attempts %d executions %d", r.Status, attempts(r), led2.Executions("run-2"))
	}
	t.Logf("$ sudo egret run -q --netns new -- sh -c '%s'\n%s(exit %d)", script, stdout.String(), ee.ExitCode())
}

func startLedgerLoopback(t *testing.T) (*ledger.Server, netip.AddrPort) {
	t.Helper()
	return startLedger(t, netip.MustParseAddr("127.0.0.1"))
}

// TestCommandsSayWhatIsMissing: without root, or without a kernel feature,
// both commands name what is missing and exit non-zero.
func TestCommandsSayWhatIsMissing(t *testing.T) {
	testenv.RequireRoot(t)
	nothingLeftByRun(t)
	bin := egretBinary(t)
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	podsFile := dir + "/pods.yaml"
	os.WriteFile(podsFile, []byte("pods: []\n"), 0o644)
	cases := []struct {
		name string
		cmd  *exec.Cmd
		want string
	}{
		{"agent without root", asNobody(exec.Command(bin, "agent", "--pods", podsFile)), "needs root"},
		{"run without root", asNobody(exec.Command(bin, "run", "--", "true")), "needs root"},
		{"agent without cgroup v2", hideCgroup2(bin, "agent", "--pods", podsFile, "--admin", ""), "kernel feature missing: cgroup v2 at"},
		{"run without BTF", hideBTF(bin, "run", "--", "true"), "kernel feature missing: kernel BTF"},
		{"agent with a bad pods file", exec.Command(bin, "agent", "--pods", "/nonexistent/pods.yaml"), "/nonexistent/pods.yaml"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tc.cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("exit: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("output %q does not say %q", out, tc.want)
			}
			t.Logf("exit %d: %s", ee.ExitCode(), strings.TrimSpace(string(out)))
		})
	}
}

func asNobody(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Dir = "/"
	return cmd
}

// hideCgroup2 runs egret in a mount namespace where the cgroup v2 mount
// is covered by a tmpfs, as on a machine without cgroup v2.
func hideCgroup2(bin string, args ...string) *exec.Cmd {
	return exec.Command("unshare", append([]string{"-m", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs none ` + cgroup2.Root() + ` && exec "$@"`, "sh", bin}, args...)...)
}

// hideBTF covers /sys/kernel/btf, as on a kernel built without BTF.
func hideBTF(bin string, args ...string) *exec.Cmd {
	return exec.Command("unshare", append([]string{"-m", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs none /sys/kernel/btf && exec "$@"`, "sh", bin}, args...)...)
}

// runLeftovers lists what `egret run` makes: cgroups, pins and
// namespaces named egret-run-*, and its egr* veths.
func runLeftovers() map[string]bool {
	got := map[string]bool{}
	for _, d := range []string{cgroup2.Root(), "/sys/fs/bpf", "/run/netns"} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "egret-run-") {
				got[d+"/"+e.Name()] = true
			}
		}
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "egr") {
			got["interface "+l.Attrs().Name] = true
		}
	}
	return got
}

// nothingLeftByRun checks, when the test ends, that no egret run left
// anything that was not there when it started (someone else's egret run
// may be going on at the same time).
func nothingLeftByRun(t *testing.T) {
	t.Helper()
	before := runLeftovers()
	t.Cleanup(func() {
		for x := range runLeftovers() {
			if !before[x] && !runAlive(x) {
				t.Errorf("left behind by egret run: %s", x)
			}
		}
	})
}

// runAlive reports whether the run a leftover (path or "interface NAME")
// belongs to is still going on: its egret process is in its cgroup.
// Another package's tests may run egret run at the same time; what they
// have while they run is not left behind.
func runAlive(leftover string) bool {
	suffix := leftover[len(leftover)-8:]
	runs, _ := filepath.Glob(filepath.Join(cgroup2.Root(), "egret-run-*"+suffix))
	for _, r := range runs {
		if b, err := os.ReadFile(filepath.Join(r, "egret", "cgroup.procs")); err == nil && len(bytes.TrimSpace(b)) > 0 {
			return true
		}
	}
	return false
}

// runOfCgroup returns the egret run (egret-run-XXXX) whose sub cgroup
// ("/cmd", "/egret") a /proc/PID/cgroup listing names, or "".
func runOfCgroup(listing, sub string) string {
	for _, l := range strings.Split(listing, "\n") {
		if rest, ok := strings.CutPrefix(l, "0::/"); ok && strings.HasPrefix(rest, "egret-run-") && strings.HasSuffix(rest, sub) {
			return strings.TrimSuffix(rest, sub)
		}
	}
	return ""
}

// removeRun removes what the egret run name made, if it is still there:
// its processes, cgroups, pins, network namespace and veth. For a test
// that kills a run, so that a failure leaves nothing behind.
func removeRun(t *testing.T, name string) {
	top := filepath.Join(cgroup2.Root(), name)
	for _, sub := range []string{"cmd", "egret"} {
		dir := filepath.Join(top, sub)
		// cgroup.kill ends every process in it at once (Linux 5.14).
		if os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0) == nil {
			waitEmpty(t, dir)
		}
		_ = os.Remove(dir)
	}
	_ = os.Remove(top)
	_ = os.RemoveAll(filepath.Join("/sys/fs/bpf", name))
	if l, err := netlink.LinkByName("egr" + name[len(name)-8:]); err == nil {
		_ = netlink.LinkDel(l)
	}
	if _, err := os.Stat(filepath.Join("/run/netns", name)); err == nil {
		_ = syscall.Unmount(filepath.Join("/run/netns", name), syscall.MNT_DETACH)
		_ = os.Remove(filepath.Join("/run/netns", name))
	}
	for x := range runLeftovers() {
		if strings.Contains(x, name[len(name)-8:]) {
			t.Errorf("could not remove %s", x)
		}
	}
}

// TestEgretRunCollectsWhatAKilledRunLeft: an `egret run` killed with
// SIGKILL cannot clean up (its command keeps running, its pinned links
// keep its cgroup attached); the next `egret run` removes all of it.
func TestEgretRunCollectsWhatAKilledRunLeft(t *testing.T) {
	testenv.RequireRoot(t)
	nothingLeftByRun(t)
	bin := egretBinary(t)
	// The command says when it runs, and its pid, whose cgroup names the
	// run (another egret run may be starting at the same time).
	victim := exec.Command(bin, "run", "-q", "--netns", "new", "--", "sh", "-c", "echo $$; exec sleep 300")
	out, err := victim.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	// Whatever happens below, nothing of the killed run stays: the
	// cleanup learns the run from egret's own cgroup if the test did not
	// get that far, before it kills egret.
	var name string
	t.Cleanup(func() {
		if name == "" {
			if cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", victim.Process.Pid)); err == nil {
				name = runOfCgroup(string(cg), "/egret")
			}
		}
		victim.Process.Kill()
		victim.Wait()
		if name != "" {
			removeRun(t, name)
		}
	})
	var pid int
	if _, err := fmt.Fscan(out, &pid); err != nil {
		t.Fatalf("egret run did not start its command: %v", err)
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	if name = runOfCgroup(string(cg), "/cmd"); name == "" {
		t.Fatalf("the command is not in an egret run's cgroup: %q", cg)
	}
	victim.Process.Kill()
	victim.Wait()
	top := filepath.Join(cgroup2.Root(), name)
	procs, _ := os.ReadFile(filepath.Join(top, "cmd", "cgroup.procs"))
	if len(strings.TrimSpace(string(procs))) == 0 {
		t.Fatal("the killed run's command is not running")
	}
	// Age it past the grace given to runs that are starting.
	old := time.Now().Add(-time.Minute)
	if err := os.Chtimes(top, old, old); err != nil {
		t.Fatal(err)
	}
	collected, err := exec.Command(bin, "run", "--", "true").CombinedOutput()
	if err != nil {
		t.Fatalf("egret run: %v\n%s", err, collected)
	}
	if !strings.Contains(string(collected), "removed what an earlier egret run left") {
		t.Fatalf("not collected:\n%s", collected)
	}
	for x := range runLeftovers() {
		if strings.Contains(x, name) || strings.Contains(x, "egr"+name[len(name)-8:]) {
			t.Errorf("still there: %s", x)
		}
	}
	t.Logf("a SIGKILLed egret run (%s: pins, cgroups with its command, namespace, veth) was removed by the next one", name)
}

// waitEmpty waits until the cgroup dir holds no process: its
// cgroup.events says "populated 0", and the kernel notifies a change of
// that file to inotify.
func waitEmpty(t *testing.T, dir string) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Error(err)
		return
	}
	defer unix.Close(fd)
	events := filepath.Join(dir, "cgroup.events")
	if _, err := unix.InotifyAddWatch(fd, events, unix.IN_MODIFY); err != nil {
		return // gone already
	}
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 4096)
	for {
		b, err := os.ReadFile(events)
		if err != nil || strings.Contains(string(b), "populated 0") {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			t.Errorf("%s: processes still there after cgroup.kill", dir)
			return
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(pfd, int(left.Milliseconds())+1); n > 0 {
			_, _ = unix.Read(fd, buf)
		}
	}
}
