package cli

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egret-proxy/egret/agent/netns"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// TestCollectTouchesOnlyRunsWhoseProcessIsGone: a live `egret run` holds
// its lock; the clean-up of stale runs leaves it alone even where the old
// rule (no process in its egret cgroup) would have taken it for dead — here
// a run whose namespace exists and whose cgroups do not (yet). Once the
// lock is released (its process gone), the same run is collected.
func TestCollectTouchesOnlyRunsWhoseProcessIsGone(t *testing.T) {
	testenv.RequireRoot(t)
	b := make([]byte, 4)
	rand.Read(b)
	name := runPrefix + hex.EncodeToString(b)
	only := func(n string) bool { return n == name }
	// Registered before the lock and the namespace are made: whatever
	// fails, neither stays.
	t.Cleanup(func() {
		netns.DeleteNamed(name)
		os.Remove(runLockPath(name))
	})
	lock, err := lockRun(name)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.NewNamed(name)
	if err != nil {
		lock.Close()
		t.Fatal(err)
	}
	ns.Close()
	log := slog.New(slog.DiscardHandler)
	collectStaleRuns(log, only)
	if _, err := os.Stat(filepath.Join(netns.Dir, name)); err != nil {
		t.Fatalf("a live run's namespace was removed: %v", err)
	}
	if _, err := os.Stat(runLockPath(name)); err != nil {
		t.Fatalf("a live run's lock was removed: %v", err)
	}
	lock.Close() // the run's process is gone
	collectStaleRuns(log, only)
	if _, err := os.Stat(filepath.Join(netns.Dir, name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a dead run's namespace is still there: %v", err)
	}
	if _, err := os.Stat(runLockPath(name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a dead run's lock file is still there: %v", err)
	}
}

// TestRunCommandNotFoundOrNotExecutable: egret run answers as a shell
// does for a command it cannot start: 127 when it is not found, 126 when
// it is found but is a directory or not executable; one line saying which.
func TestRunCommandNotFoundOrNotExecutable(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A PATH whose only "inpath" is not executable.
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	if err := os.WriteFile(filepath.Join(dir, "inpath"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cmd  string
		code int
		says string
	}{
		{filepath.Join(dir, "missing"), 127, "command not found"},
		{"egret-no-such-command", 127, "egret-no-such-command: command not found (not in PATH)"},
		{dir, 126, dir + ": is a directory, not a command"},
		{plain, 126, plain + ": found but not executable (permission denied)"},
		{"inpath", 126, filepath.Join(dir, "inpath") + ": found but not executable"},
	} {
		out, errOut, code := egret("run", "--", tc.cmd)
		if code != tc.code || !strings.Contains(errOut, tc.says) || strings.Count(errOut, "\n") != 1 || out != "" {
			t.Errorf("egret run -- %s: exit %d, stdout %q, stderr %q; want exit %d and one line saying %q", tc.cmd, code, out, errOut, tc.code, tc.says)
		}
	}
}
