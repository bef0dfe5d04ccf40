package helm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestModVersion(t *testing.T) {
	mod := []byte("module x\n\nrequire helm.sh/helm/v3 v3.22.0\n\nrequire (\n\tk8s.io/client-go v0.37.0 // indirect\n\tk8s.io/client-go-extra v0.1.0\n)\n\nreplace k8s.io/api => k8s.io/api v0.37.0\n")
	for module, want := range map[string]string{
		"helm.sh/helm/v3":  "v3.22.0",
		"k8s.io/client-go": "v0.37.0",
		"k8s.io/api":       "",
		"k8s.io/kubectl":   "",
	} {
		if got := modVersion(mod, module); got != want {
			t.Errorf("modVersion(%s) = %q, want %q", module, got, want)
		}
	}
}

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
	hv, kv := modVersion(mod, "helm.sh/helm/v3"), modVersion(mod, "k8s.io/client-go")
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
	if want := modVersion(mod, "helm.sh/helm/v3"); string(out) != want {
		t.Errorf("helm version %q, want %q", out, want)
	}
}
