package cli

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/egret-proxy/egret/agent/netns"
	"github.com/egret-proxy/egret/internal/testenv"
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
