package cli

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

func TestSelfCgroupForPinDir(t *testing.T) {
	if got := agent.SelfCgroupFor(bpfload.DefaultPinDir); got != agent.DefaultSelfCgroup {
		t.Errorf("default pin dir: %s, want %s", got, agent.DefaultSelfCgroup)
	}
	a := agent.SelfCgroupFor("/sys/fs/bpf/egret-demo")
	b := agent.SelfCgroupFor("/sys/fs/bpf/other/egret-demo")
	if a == b || a == agent.DefaultSelfCgroup || filepath.Dir(a) != cgroup2.Root() ||
		!strings.HasPrefix(filepath.Base(a), "egret-agent-egret-demo-") {
		t.Errorf("two pin dirs gave %s and %s", a, b)
	}
	if agent.SelfCgroupFor("/sys/fs/bpf/egret-demo/") != a {
		t.Error("the same pin dir, written differently, gave another cgroup")
	}
}

var cgroupField = regexp.MustCompile(` cgroup=(\S+)`)

// TestTwoAgentsGetTheirOwnCgroups starts two real agents, without
// --cgroup, from one cgroup that also holds another process (as two agents
// started from one shell): each moves to a cgroup of its own, named after
// its pin dir, and removes it on exit (--cleanup).
func TestTwoAgentsGetTheirOwnCgroups(t *testing.T) {
	testenv.RequireRoot(t)
	if err := bpfload.Probe(); err != nil {
		testenv.Require(t, false, err.Error())
	}
	bin := buildEgret(t)
	dir := t.TempDir()
	podsFile := filepath.Join(dir, "pods.yaml")
	if err := os.WriteFile(podsFile, []byte("pods: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The "shell": a cgroup with a process in it.
	shell := filepath.Join(cgroup2.Root(), "egret-test-shell-"+randSuffix())
	if err := os.Mkdir(shell, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(shell) })
	cgfd, err := syscall.Open(shell, syscall.O_DIRECTORY|syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(cgfd)
	inShell := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgfd}
		return cmd
	}
	sleeper := inShell(exec.Command("sleep", "600"))
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })

	type started struct {
		cmd    *exec.Cmd
		cgroup string
		pin    string
	}
	var agents []started
	for i := range 2 {
		pin := filepath.Join(bpfload.BPFFSRoot, "egret-test-"+randSuffix())
		want := agent.SelfCgroupFor(pin)
		t.Cleanup(func() {
			_ = os.RemoveAll(pin)
			_ = os.Remove(want)
		})
		cmd := inShell(exec.Command(bin, "agent", "--pods", podsFile, "--pin-dir", pin,
			"--admin", filepath.Join(dir, strconv.Itoa(i)+".sock"), "--cleanup"))
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		// The first line says where the agent runs, or why it stopped.
		sc := bufio.NewScanner(stderr)
		var line string
		for sc.Scan() {
			if line = sc.Text(); strings.Contains(line, "egret agent running") || strings.HasPrefix(line, "egret:") {
				break
			}
		}
		go func() {
			for sc.Scan() {
			}
		}()
		m := cgroupField.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("agent %d: %q", i, line)
		}
		if m[1] != want {
			t.Errorf("agent %d with pin dir %s runs in %s, want %s", i, pin, m[1], want)
		}
		procs, err := os.ReadFile(filepath.Join(m[1], "cgroup.procs"))
		if err != nil || !strings.Contains("\n"+string(procs), "\n"+strconv.Itoa(cmd.Process.Pid)+"\n") {
			t.Errorf("agent %d (pid %d) not in %s: %q %v", i, cmd.Process.Pid, m[1], procs, err)
		}
		agents = append(agents, started{cmd, m[1], pin})
	}
	if agents[0].cgroup == agents[1].cgroup {
		t.Fatalf("both agents run in %s", agents[0].cgroup)
	}
	for i, a := range agents {
		if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- a.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent %d: %v", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("agent %d did not stop on SIGTERM", i)
		}
		for _, p := range []string{a.cgroup, a.pin} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("agent %d left %s behind (%v)", i, p, err)
			}
		}
	}
}
