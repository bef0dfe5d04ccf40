package kubeapi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/internal/testenv"
)

// Environment variables naming prebuilt binaries; when both are set the
// tools module is not built.
const (
	EnvAPIServer = "EGRET_KUBE_APISERVER"
	EnvEtcd      = "EGRET_ETCD"
)

// The programs the tools module builds: package, the file go build writes
// (a major-version suffix is skipped: etcd's main package is its module
// root, go.etcd.io/etcd/server/v3) and the name it is kept under.
var programs = []struct{ pkg, out, name string }{
	{"k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver", "kube-apiserver"},
	{"go.etcd.io/etcd/server/v3", "server", "etcd"},
}

var (
	binMu   sync.Mutex
	binDone bool
	binAPI  string
	binEtcd string
	binErr  error
)

// Binaries returns the paths of kube-apiserver and etcd, building them
// from the tools module the first time on a machine (minutes; see
// README.md). The binaries are kept under the user cache directory by the
// hash of the tools module's go.sum, and a file lock makes concurrent test
// processes wait for one build. A missing go command or a failed build
// skips the test, or fails it under CI (internal/testenv).
func Binaries(t testing.TB) (apiserver, etcd string) {
	t.Helper()
	if a, e := os.Getenv(EnvAPIServer), os.Getenv(EnvEtcd); a != "" && e != "" {
		return a, e
	}
	binMu.Lock()
	defer binMu.Unlock()
	if !binDone {
		binAPI, binEtcd, binErr = build(t)
		binDone = true
	}
	testenv.Require(t, binErr == nil, fmt.Sprintf("kube-apiserver and etcd built from test/kubeapi/tools: %v", binErr))
	return binAPI, binEtcd
}

// ToolsDir is the tools module's directory (beside this file).
func ToolsDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "tools")
}

// CacheDir is where the binaries for the current tools module are kept:
// the user cache directory's egret/kubeapi/HASH, HASH a hash of the tools
// module's go.sum (and of the build flags).
func CacheDir() (string, error) {
	sum, err := os.ReadFile(filepath.Join(ToolsDir(), "go.sum"))
	if err != nil {
		return "", fmt.Errorf("tools module: %w", err)
	}
	flags, err := ldflags()
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
	return filepath.Join(base, "egret", "kubeapi", hex.EncodeToString(h.Sum(nil)[:8])), nil
}

// ldflags stamp kube-apiserver with the Kubernetes version the tools
// module requires (unstamped it reports v0.0.0-master).
func ldflags() (string, error) {
	mod, err := os.ReadFile(filepath.Join(ToolsDir(), "go.mod"))
	if err != nil {
		return "", fmt.Errorf("tools module: %w", err)
	}
	var v string
	for _, line := range strings.Split(string(mod), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "k8s.io/kubernetes" && strings.HasPrefix(f[1], "v") {
			v = f[1]
		}
	}
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return "", fmt.Errorf("tools module: no k8s.io/kubernetes version in go.mod")
	}
	const pkg = "k8s.io/component-base/version"
	return fmt.Sprintf("-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean",
		pkg, v, pkg, parts[0], pkg, parts[1], pkg), nil
}

func build(t testing.TB) (string, string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", "", err
	}
	api, etcd := filepath.Join(dir, "kube-apiserver"), filepath.Join(dir, "etcd")
	if present(api, etcd) {
		return api, etcd, nil
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", "", fmt.Errorf("the go command is needed to build them: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	// One build per machine: other test processes wait here.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", "", err
	}
	defer lock.Close()
	waitStart := time.Now()
	if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		testenv.Progress("kubeapi: waiting for another process's build of kube-apiserver and etcd (cold: about 4 minutes on 2 cores)")
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	if present(api, etcd) {
		t.Logf("kubeapi: waited %v for another process's build of kube-apiserver and etcd", time.Since(waitStart).Round(time.Second))
		return api, etcd, nil
	}

	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(tmp)
	testenv.Progress("kubeapi: building kube-apiserver and etcd in %s (once per machine, then cached; about 4 minutes on 2 cores)", ToolsDir())
	start := time.Now()
	stopTicks := progressEvery(30*time.Second, func(d time.Duration) {
		testenv.Progress("kubeapi: still building kube-apiserver and etcd (%v)", d.Round(time.Second))
	})
	flags, err := ldflags()
	if err != nil {
		return "", "", err
	}
	args := []string{"build", "-ldflags", flags, "-o", tmp + string(filepath.Separator)}
	for _, p := range programs {
		args = append(args, p.pkg)
	}
	cmd := exec.Command(goCmd, args...)
	cmd.Dir = ToolsDir()
	// The tools module on its own: no workspace, none of the caller's
	// flags (a -race of the test command would make the build far slower).
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
	out, err := cmd.CombinedOutput()
	stopTicks()
	took := time.Since(start)
	if err != nil {
		return "", "", fmt.Errorf("go build (after %v): %v: %s", took.Round(time.Second), err, strings.TrimSpace(string(out)))
	}
	for _, p := range programs {
		if err := os.Rename(filepath.Join(tmp, p.out), filepath.Join(dir, p.name)); err != nil {
			return "", "", err
		}
	}
	info := fmt.Sprintf("built %s in %v with %s\n", time.Now().UTC().Format(time.RFC3339), took.Round(time.Second), runtime.Version())
	_ = os.WriteFile(filepath.Join(dir, "BUILD"), []byte(info), 0o644)
	t.Logf("kubeapi: built kube-apiserver and etcd in %v (cached in %s)", took.Round(time.Second), dir)
	fmt.Fprintf(os.Stderr, "kubeapi: built kube-apiserver and etcd in %v\n", took.Round(time.Second))
	return api, etcd, nil
}

func present(paths ...string) bool {
	for _, p := range paths {
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
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
