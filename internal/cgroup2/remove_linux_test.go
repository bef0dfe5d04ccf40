package cgroup2

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// A cgroup with a process in it: Remove waits for the process's exit
// (here after cgroup.kill), not a fixed time, then removes the directory;
// with the process alive it gives up at its timeout and says so.
func TestRemoveWaitsForTheLastProcess(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(Root(), "egret-test-remove-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		Remove(dir, 10*time.Second)
	})
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	if err := Remove(dir, 100*time.Millisecond); !errors.Is(err, ErrPopulated) {
		t.Fatalf("Remove with a live process: %v, want ErrPopulated", err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the populated cgroup is gone: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := Remove(dir, 10*time.Second); err != nil {
		t.Fatalf("Remove after cgroup.kill: %v", err)
	}
	t.Logf("removed %v after cgroup.kill", time.Since(start).Round(time.Microsecond))
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after Remove: %v", err)
	}
	<-waited
	if err := Remove(dir, time.Second); err != nil {
		t.Fatalf("Remove of a removed cgroup: %v", err)
	}
}
