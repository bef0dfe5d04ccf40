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
	{"k8s.io/kubernetes/cmd/kubelet", "kubelet", "kubelet"},
	{"k8s.io/kubernetes/cmd/kube-controller-manager", "kube-controller-manager", "kube-controller-manager"},
	{"k8s.io/kubernetes/cmd/kube-scheduler", "kube-scheduler", "kube-scheduler"},
}

// Program names for Programs.
const (
	APIServer         = "kube-apiserver"
	Etcd              = "etcd"
	Kubelet           = "kubelet"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
)

var binMu sync.Mutex

// Binaries returns the paths of kube-apiserver and etcd, building them
// from the tools module the first time on a machine (minutes; see
// README.md). EGRET_KUBE_APISERVER and EGRET_ETCD name prebuilt ones
// instead.
func Binaries(t testing.TB) (apiserver, etcd string) {
	t.Helper()
	if a, e := os.Getenv(EnvAPIServer), os.Getenv(EnvEtcd); a != "" && e != "" {
		return a, e
	}
	p := Programs(t, APIServer, Etcd)
	return p[APIServer], p[Etcd]
}

// Programs returns the paths of the named programs (APIServer, Etcd,
// Kubelet, ControllerManager, Scheduler), building those not built yet
// from the tools module in one go build. The binaries are kept under the
// user cache directory by the hash of the tools module's go.sum, and a
// file lock makes concurrent test processes wait for one build. The build
// reports its start and end on standard error, and on /dev/tty when there
// is one (go test keeps a passing package's output to itself). A missing go
// command or a failed build skips the test, or fails it under CI
// (internal/testenv).
func Programs(t testing.TB, names ...string) map[string]string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	key := strings.Join(names, ",")
	paths, err := Build(names...)
	testenv.Require(t, err == nil, fmt.Sprintf("%s built from test/kubeapi/tools: %v", key, err))
	return paths
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

// Build is Programs without a test: it returns the paths of the named
// programs, building those missing (all of them if names is empty).
// `go run ./test/kubeapi/cmd/kubetools` calls it, so that a first run
// builds with its progress in sight instead of inside a test's timeout.
func Build(names ...string) (map[string]string, error) {
	if len(names) == 0 {
		for _, p := range programs {
			names = append(names, p.name)
		}
	}
	dir, err := CacheDir()
	if err != nil {
		return nil, err
	}
	paths := map[string]string{}
	var want []string
	for _, n := range names {
		found := false
		for _, p := range programs {
			if p.name == n {
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("no program %q in the tools module", n)
		}
		paths[n] = filepath.Join(dir, n)
		want = append(want, paths[n])
	}
	if present(want...) {
		return paths, nil
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("the go command is needed to build them: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// One build per machine: other test processes wait here.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	waitStart := time.Now()
	if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		testenv.Progress("kubeapi: waiting for another process's build of the Kubernetes programs")
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	var missing []struct{ pkg, out, name string }
	for _, p := range programs {
		if _, ok := paths[p.name]; ok && !present(paths[p.name]) {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		testenv.Progress("kubeapi: waited %v for another process's build", time.Since(waitStart).Round(time.Second))
		return paths, nil
	}

	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	var what []string
	for _, p := range missing {
		what = append(what, p.name)
	}
	testenv.Progress("kubeapi: building %s in %s (once per machine, then cached; cold: minutes to tens of minutes on 2 cores, see test/kubeapi/README.md)", strings.Join(what, ", "), ToolsDir())
	start := time.Now()
	stopTicks := progressEvery(30*time.Second, func(d time.Duration) {
		testenv.Progress("kubeapi: still building %s (%v)", strings.Join(what, ", "), d.Round(time.Second))
	})
	flags, err := ldflags()
	if err != nil {
		return nil, err
	}
	args := []string{"build", "-ldflags", flags, "-o", tmp + string(filepath.Separator)}
	for _, p := range missing {
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
		return nil, fmt.Errorf("go build (after %v): %v: %s", took.Round(time.Second), err, strings.TrimSpace(string(out)))
	}
	for _, p := range missing {
		if err := os.Rename(filepath.Join(tmp, p.out), filepath.Join(dir, p.name)); err != nil {
			return nil, err
		}
	}
	info := fmt.Sprintf("built %s in %v with %s: %s\n", time.Now().UTC().Format(time.RFC3339), took.Round(time.Second), runtime.Version(), strings.Join(what, ", "))
	if f, err := os.OpenFile(filepath.Join(dir, "BUILD"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
		_, _ = f.WriteString(info)
		f.Close()
	}
	testenv.Progress("kubeapi: built %s in %v (cached in %s)", strings.Join(what, ", "), took.Round(time.Second), dir)
	return paths, nil
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
