// Package helm builds the helm command for tests, from the Go module proxy:
// helm.sh/helm/v3's cmd/helm at the version test/helm/tools pins, built
// once per machine and kept under the user cache directory. deploy's tests
// run `helm lint` and `helm template` on deploy/helm/egret with it.
//
//	bin := helm.Binary(t) // fails the test under CI=true if it cannot be built
package helm

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

// EnvHelm names a prebuilt helm; when set the tools module is not built.
const EnvHelm = "EGRET_HELM"

var mu sync.Mutex

// Binary returns the path of helm, building it from the tools module the
// first time on a machine (a few minutes; see README.md). EGRET_HELM names
// a prebuilt one instead. A missing go command or a failed build skips the
// test, or fails it under CI (internal/testenv).
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvHelm); p != "" {
		return p
	}
	mu.Lock()
	defer mu.Unlock()
	p, err := Build()
	testenv.Require(t, err == nil, fmt.Sprintf("helm built from test/helm/tools: %v", err))
	return p
}

// ToolsDir is the tools module's directory (beside this file).
func ToolsDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "tools")
}

// CacheDir is where the helm of the current tools module is kept: the user
// cache directory's egret/helm/HASH, HASH a hash of the tools module's
// go.sum and of the build flags.
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
	return filepath.Join(base, "egret", "helm", hex.EncodeToString(h.Sum(nil)[:8])), nil
}

// modVersion returns the version go.mod requires of module.
func modVersion(mod []byte, module string) string {
	for _, line := range strings.Split(string(mod), "\n") {
		f := strings.Fields(line)
		f0 := strings.Fields(strings.TrimPrefix(strings.Join(f, " "), "require "))
		if len(f0) >= 2 && f0[0] == module && strings.HasPrefix(f0[1], "v") {
			return f0[1]
		}
	}
	return ""
}

// ldflags stamp helm as its Makefile does: its own version (unstamped it
// says v3.x-dev... or nothing useful), and the Kubernetes version its
// client libraries speak, which `helm template` and `helm lint` take as
// the cluster's (unstamped: 1.20, below what the chart's kubeVersion
// asks).
func ldflags() (string, error) {
	mod, err := os.ReadFile(filepath.Join(ToolsDir(), "go.mod"))
	if err != nil {
		return "", fmt.Errorf("tools module: %w", err)
	}
	hv := modVersion(mod, "helm.sh/helm/v3")
	kv := modVersion(mod, "k8s.io/client-go")
	parts := strings.SplitN(strings.TrimPrefix(kv, "v"), ".", 3)
	if hv == "" || len(parts) < 2 || parts[0] != "0" {
		return "", fmt.Errorf("tools module: no helm.sh/helm/v3 or k8s.io/client-go v0.x version in go.mod (%q, %q)", hv, kv)
	}
	minor := parts[1]
	return strings.Join([]string{
		"-X helm.sh/helm/v3/internal/version.version=" + hv,
		"-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
		"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1",
		"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=" + minor,
		"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
		"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=" + minor,
	}, " "), nil
}

// Build is Binary without a test: it returns helm's path, building it if
// it is not in the cache yet. A file lock makes concurrent test processes
// wait for one build. `go run ./test/helm/cmd/helmtool` calls it, so that
// a first run builds with its progress in sight.
func Build() (string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "helm")
	if present(bin) {
		return bin, nil
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go command is needed to build helm: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		testenv.Progress("helm: waiting for another process's build of helm")
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	if present(bin) {
		return bin, nil
	}
	flags, err := ldflags()
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	testenv.Progress("helm: building helm in %s (once per machine, then cached; cold: minutes on 2 cores, see test/helm/README.md)", ToolsDir())
	start := time.Now()
	cmd := exec.Command(goCmd, "build", "-trimpath", "-ldflags", flags, "-o", filepath.Join(tmp, "helm"), "helm.sh/helm/v3/cmd/helm")
	cmd.Dir = ToolsDir()
	// The tools module on its own: no workspace, none of the caller's
	// flags (a -race of the test command would make the build far slower).
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		return "", fmt.Errorf("go build (after %v): %v: %s", took.Round(time.Second), err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(filepath.Join(tmp, "helm"), bin); err != nil {
		return "", err
	}
	info := fmt.Sprintf("built %s in %v with %s\n", time.Now().UTC().Format(time.RFC3339), took.Round(time.Second), runtime.Version())
	if f, err := os.OpenFile(filepath.Join(dir, "BUILD"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
		_, _ = f.WriteString(info)
		f.Close()
	}
	testenv.Progress("helm: built in %v (cached in %s)", took.Round(time.Second), dir)
	return bin, nil
}

func present(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
