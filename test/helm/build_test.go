package helm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egret-proxy/egret/internal/testkit/toolbuild"
)

// The flags stamp the helm version and the Kubernetes minor version the
// tools module really requires.
func TestLdflagsFollowTheToolsModule(t *testing.T) {
	mod, err := os.ReadFile(filepath.Join(ToolsDir(), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	flags, err := ldflags()
	if err != nil {
		t.Fatal(err)
	}
	hv, kv := toolbuild.ModVersion(mod, "helm.sh/helm/v3"), toolbuild.ModVersion(mod, "k8s.io/client-go")
	minor := strings.Split(kv, ".")[1]
	for _, want := range []string{
		"-X helm.sh/helm/v3/internal/version.version=" + hv,
		"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=" + minor,
		"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=" + minor,
	} {
		if !strings.Contains(flags, want) {
			t.Errorf("ldflags %q lack %q", flags, want)
		}
	}
}

// The built helm reports the version the tools module pins, and takes the
// cluster for the Kubernetes of its client libraries.
func TestBinary(t *testing.T) {
	if os.Getenv(EnvHelm) != "" {
		t.Skipf("%s names a prebuilt helm", EnvHelm)
	}
	bin := Binary(t)
	out, err := exec.Command(bin, "version", "--template", "{{.Version}}").Output()
	if err != nil {
		t.Fatal(err)
	}
	mod, _ := os.ReadFile(filepath.Join(ToolsDir(), "go.mod"))
	if want := toolbuild.ModVersion(mod, "helm.sh/helm/v3"); string(out) != want {
		t.Errorf("helm version %q, want %q", out, want)
	}
}
