// Package toolbuild builds programs of a nested tools module (a Go module of
// its own beside the tests that need it, so that egret's go.mod never
// requires it) once per machine and keeps them under the user cache
// directory, by the hash of the module's go.sum and of the build flags.
// test/kubeapi (etcd and the Kubernetes programs) and test/helm use it.
//
// One build at a time per cache directory: an exclusive flock on
// DIR/.lock makes concurrent test processes wait for one build instead of
// each building. The build's start, a line every 30 s and its end reach a
// person through internal/testkit/testenv.Progress (go test keeps a passing
// package's output to itself).
package toolbuild

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// Program is one main package of the tools module.
type Program struct {
	// Pkg is the package path built.
	Pkg string
	// Out is the file go build writes for it (its last path element, a
	// major-version suffix skipped: go.etcd.io/etcd/server/v3 writes
	// "server").
	Out string
	// Name is the name it is kept under in the cache directory.
	Name string
}

// Module is a nested tools module and how its programs are built.
type Module struct {
	// Name names the cache subdirectory (egret/NAME/HASH) and the
	// progress lines.
	Name string
	// Dir is the tools module's directory.
	Dir string
	// LDFlags returns the -ldflags of the build (read from the module's
	// go.mod, typically); they are part of the cache key.
	LDFlags func() (string, error)
	// BuildArgs are more go build arguments (-trimpath).
	BuildArgs []string
	// Env is more of the build's environment (CGO_ENABLED=0).
	Env []string
	// Readme is where the build's timings are said, for the progress line.
	Readme string
}

// CacheDir is where the module's programs are kept: the user cache
// directory's egret/NAME/HASH, HASH a hash of the module's go.sum and of
// the ldflags.
func (m Module) CacheDir() (string, error) {
	sum, err := os.ReadFile(filepath.Join(m.Dir, "go.sum"))
	if err != nil {
		return "", fmt.Errorf("tools module: %w", err)
	}
	flags, err := m.LDFlags()
	if err != nil {
		return "", err
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(sum)
	h.Write([]byte(flags))
	return filepath.Join(base, "egret", m.Name, hex.EncodeToString(h.Sum(nil)[:8])), nil
}

// Build returns the paths of progs in the cache directory, building those
// missing in one go build (the module on its own: no workspace, none of
// the caller's GOFLAGS, so a -race of the test command does not reach it).
func (m Module) Build(progs ...Program) (map[string]string, error) {
	dir, err := m.CacheDir()
	if err != nil {
		return nil, err
	}
	paths := map[string]string{}
	for _, p := range progs {
		paths[p.Name] = filepath.Join(dir, p.Name)
	}
	missing := func() []Program {
		var out []Program
		for _, p := range progs {
			if !present(paths[p.Name]) {
				out = append(out, p)
			}
		}
		return out
	}
	if len(missing()) == 0 {
		return paths, nil
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("the go command is needed to build them: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	waitStart := time.Now()
	if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		testenv.Progress("%s: waiting for another process's build", m.Name)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	todo := missing()
	if len(todo) == 0 {
		testenv.Progress("%s: waited %v for another process's build", m.Name, time.Since(waitStart).Round(time.Second))
		return paths, nil
	}
	flags, err := m.LDFlags()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	var what []string
	for _, p := range todo {
		what = append(what, p.Name)
	}
	names := strings.Join(what, ", ")
	testenv.Progress("%s: building %s in %s (once per machine, then cached; cold: minutes on 2 cores, see %s)", m.Name, names, m.Dir, m.Readme)
	start := time.Now()
	stopTicks := progressEvery(30*time.Second, func(d time.Duration) {
		testenv.Progress("%s: still building %s (%v)", m.Name, names, d.Round(time.Second))
	})
	args := append([]string{"build"}, m.BuildArgs...)
	args = append(args, "-ldflags", flags, "-o", tmp+string(filepath.Separator))
	for _, p := range todo {
		args = append(args, p.Pkg)
	}
	cmd := exec.Command(goCmd, args...)
	cmd.Dir = m.Dir
	cmd.Env = append(append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false"), m.Env...)
	out, err := cmd.CombinedOutput()
	stopTicks()
	took := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("go build (after %v): %v: %s", took.Round(time.Second), err, strings.TrimSpace(string(out)))
	}
	for _, p := range todo {
		if err := os.Rename(filepath.Join(tmp, p.Out), paths[p.Name]); err != nil {
			return nil, err
		}
	}
	info := fmt.Sprintf("built %s in %v with %s: %s\n", time.Now().UTC().Format(time.RFC3339), took.Round(time.Second), runtime.Version(), names)
	if f, err := os.OpenFile(filepath.Join(dir, "BUILD"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
		_, _ = f.WriteString(info)
		f.Close()
	}
	testenv.Progress("%s: built %s in %v (cached in %s)", m.Name, names, took.Round(time.Second), dir)
	return paths, nil
}

func present(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// progressEvery calls report with the time elapsed every interval until
// stop is called: pacing for a person watching, not synchronisation.
func progressEvery(interval time.Duration, report func(time.Duration)) (stop func()) {
	start := time.Now()
	t := time.NewTicker(interval)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-t.C:
				report(time.Since(start))
			}
		}
	}()
	return func() { t.Stop(); close(done) }
}

// ModVersion returns the version go.mod requires of module ("" if none).
func ModVersion(mod []byte, module string) string {
	for _, line := range strings.Split(string(mod), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == module && strings.HasPrefix(f[1], "v") {
			return f[1]
		}
	}
	return ""
}
