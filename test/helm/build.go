// Package helm builds the helm command for tests, from the Go module proxy:
// helm.sh/helm/v3's cmd/helm at the version test/helm/tools pins, built
// once per machine and kept under the user cache directory. deploy's tests
// run `helm lint` and `helm template` on deploy/helm/egret with it.
//
//	bin := helm.Binary(t) // fails the test under CI=true if it cannot be built
package helm

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/internal/testkit/toolbuild"
)

// EnvHelm names a prebuilt helm; when set the tools module is not built.
const EnvHelm = "EGRET_HELM"

var mu sync.Mutex

// Binary returns the path of helm, building it from the tools module the
// first time on a machine (a few minutes; see README.md). EGRET_HELM names
// a prebuilt one instead. A missing go command or a failed build skips the
// test, or fails it under CI (internal/testkit/testenv).
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

// module is the tools module as internal/testkit/toolbuild builds it: helm with
// -trimpath and without cgo, as its own release builds are.
func module() toolbuild.Module {
	return toolbuild.Module{Name: "helm", Dir: ToolsDir(), LDFlags: ldflags,
		BuildArgs: []string{"-trimpath"}, Env: []string{"CGO_ENABLED=0"}, Readme: "test/helm/README.md"}
}

// CacheDir is where the helm of the current tools module is kept: the user
// cache directory's egret/helm/HASH, HASH a hash of the tools module's
// go.sum and of the build flags.
func CacheDir() (string, error) { return module().CacheDir() }

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
	hv := toolbuild.ModVersion(mod, "helm.sh/helm/v3")
	kv := toolbuild.ModVersion(mod, "k8s.io/client-go")
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
	paths, err := module().Build(toolbuild.Program{Pkg: "helm.sh/helm/v3/cmd/helm", Out: "helm", Name: "helm"})
	if err != nil {
		return "", err
	}
	return paths["helm"], nil
}
