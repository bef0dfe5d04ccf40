package kubeapi

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/internal/testkit/toolbuild"
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
var programs = []toolbuild.Program{
	{Pkg: "k8s.io/kubernetes/cmd/kube-apiserver", Out: "kube-apiserver", Name: "kube-apiserver"},
	{Pkg: "go.etcd.io/etcd/server/v3", Out: "server", Name: "etcd"},
	{Pkg: "k8s.io/kubernetes/cmd/kubelet", Out: "kubelet", Name: "kubelet"},
	{Pkg: "k8s.io/kubernetes/cmd/kube-controller-manager", Out: "kube-controller-manager", Name: "kube-controller-manager"},
	{Pkg: "k8s.io/kubernetes/cmd/kube-scheduler", Out: "kube-scheduler", Name: "kube-scheduler"},
	{Pkg: "k8s.io/kubernetes/cmd/kube-proxy", Out: "kube-proxy", Name: "kube-proxy"},
}

// Program names for Programs.
const (
	APIServer         = "kube-apiserver"
	Etcd              = "etcd"
	Kubelet           = "kubelet"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
	Proxy             = "kube-proxy"
	CoreDNS           = "coredns"
)

// coredns is CoreDNS, from a module of its own (coredns/, beside the tools
// module: CoreDNS requires newer client-go, gRPC and OpenTelemetry than
// Kubernetes pins), static and stripped: test/kubenode puts it in an image.
var coredns = toolbuild.Program{Pkg: "github.com/egret-proxy/egret/test/kubeapi/coredns", Out: "coredns", Name: CoreDNS}

// CoreDNSDir is the CoreDNS module's directory (beside this file).
func CoreDNSDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "coredns")
}

// corednsModule builds CoreDNS as its release builds are: without cgo,
// -trimpath; stripped (-s -w) and stamped with the version it is.
func corednsModule() toolbuild.Module {
	return toolbuild.Module{Name: "coredns", Dir: CoreDNSDir(), LDFlags: corednsLDFlags,
		BuildArgs: []string{"-trimpath"}, Env: []string{"CGO_ENABLED=0"}, Readme: "test/kubenode/README.md"}
}

func corednsLDFlags() (string, error) {
	mod, err := os.ReadFile(filepath.Join(CoreDNSDir(), "go.mod"))
	if err != nil {
		return "", fmt.Errorf("coredns module: %w", err)
	}
	v := toolbuild.ModVersion(mod, "github.com/coredns/coredns")
	if v == "" {
		return "", fmt.Errorf("coredns module: no github.com/coredns/coredns version in go.mod")
	}
	return "-s -w -X github.com/coredns/coredns/coremain.GitCommit=" + v, nil
}

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
// Kubelet, ControllerManager, Scheduler, Proxy, CoreDNS), building those
// not built yet: the Kubernetes ones from the tools module in one go build,
// CoreDNS from its own module. The binaries are kept under the
// user cache directory by the hash of the tools module's go.sum, and a
// file lock makes concurrent test processes wait for one build. The build
// reports its start and end on standard error, and on /dev/tty when there
// is one (go test keeps a passing package's output to itself). A missing go
// command or a failed build skips the test, or fails it under CI
// (internal/testkit/testenv).
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

// module is the tools module as internal/testkit/toolbuild builds it.
func module() toolbuild.Module {
	return toolbuild.Module{Name: "kubeapi", Dir: ToolsDir(), LDFlags: ldflags, Readme: "test/kubeapi/README.md"}
}

// CacheDir is where the binaries for the current tools module are kept:
// the user cache directory's egret/kubeapi/HASH, HASH a hash of the tools
// module's go.sum (and of the build flags).
func CacheDir() (string, error) { return module().CacheDir() }

// ldflags stamp kube-apiserver with the Kubernetes version the tools
// module requires (unstamped it reports v0.0.0-master).
func ldflags() (string, error) {
	mod, err := os.ReadFile(filepath.Join(ToolsDir(), "go.mod"))
	if err != nil {
		return "", fmt.Errorf("tools module: %w", err)
	}
	v := toolbuild.ModVersion(mod, "k8s.io/kubernetes")
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
			names = append(names, p.Name)
		}
		names = append(names, CoreDNS)
	}
	var progs []toolbuild.Program
	withCoreDNS := false
	for _, n := range names {
		found := n == CoreDNS
		withCoreDNS = withCoreDNS || found
		for _, p := range programs {
			if p.Name == n {
				progs, found = append(progs, p), true
			}
		}
		if !found {
			return nil, fmt.Errorf("no program %q in the tools module", n)
		}
	}
	paths := map[string]string{}
	if len(progs) > 0 {
		p, err := module().Build(progs...)
		if err != nil {
			return nil, err
		}
		maps.Copy(paths, p)
	}
	if withCoreDNS {
		p, err := corednsModule().Build(coredns)
		if err != nil {
			return nil, err
		}
		maps.Copy(paths, p)
	}
	return paths, nil
}
