package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/egret-proxy/egret/deploy/image/imagebuild"
	"github.com/egret-proxy/egret/internal/ociimage"
	"github.com/egret-proxy/egret/test/helm"
)

// TestRelease: one command, offline (GOPROXY=off), makes the image index
// and the chart package of one version: the image is named
// REPOSITORY:VERSION with linux/amd64 and linux/arm64 manifests labelled
// VERSION; the chart's version and appVersion are VERSION, and helm
// template of the package runs exactly that image.
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles egret twice")
	}
	t.Setenv("GOPROXY", "off")
	t.Setenv("GOFLAGS", "-mod=readonly")
	helmBin := helm.Binary(t)
	const version, repo = "1.2.3-rc.1", "registry.test/team/egret"
	out := t.TempDir()
	var log strings.Builder
	r, err := Make(Options{Version: version, Repository: repo, Out: out, Helm: helmBin, Platforms: imagebuild.DefaultPlatforms}, &log)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", log.String())

	f, err := os.Open(r.Image)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := ociimage.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	if l.Name != repo+":"+version || l.Digest != r.ImageDigest || len(l.Platforms) != 2 {
		t.Fatalf("image %s %s, %d platforms; want %s:%s %s, 2", l.Name, l.Digest, len(l.Platforms), repo, version, r.ImageDigest)
	}
	for _, p := range l.Platforms {
		if p.Labels["org.opencontainers.image.version"] != version || !strings.Contains(string(p.Files["egret"]), version) {
			t.Errorf("%s: label %q, or the binary lacks %s", p.Architecture, p.Labels["org.opencontainers.image.version"], version)
		}
	}

	chart := chartFiles(t, r.Chart)
	var meta struct {
		Name, Version string
		AppVersion    string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal(chart["egret/Chart.yaml"], &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Name != "egret" || meta.Version != version || meta.AppVersion != version {
		t.Errorf("Chart.yaml: %+v, want version and appVersion %s", meta, version)
	}
	rendered, err := exec.Command(helmBin, "template", "egret", r.Chart, "--namespace", "egret-system").CombinedOutput()
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", r.Chart, err, rendered)
	}
	if want := "image: " + repo + ":" + version; !strings.Contains(string(rendered), want) {
		t.Errorf("the packaged chart does not run %q:\n%s", want, grepImage(string(rendered)))
	}
	// The install's notes say which image must be pullable, and from where.
	notes := string(chart["egret/templates/NOTES.txt"])
	if !strings.Contains(notes, "egret publishes no image") || !strings.Contains(notes, `{{ include "egret.image" . }}`) {
		t.Errorf("NOTES.txt does not say where the image must come from:\n%s", notes)
	}
	if strings.Contains(string(rendered), "ghcr.io/egret-proxy/egret") {
		t.Errorf("the packaged chart still names the default repository:\n%s", grepImage(string(rendered)))
	}
}

func TestReleaseRefusesBadInput(t *testing.T) {
	for _, o := range []Options{
		{Version: "v1.0.0", Repository: DefaultRepository},
		{Version: "1.0", Repository: DefaultRepository},
		{Version: "1.0.0", Repository: "registry.test/egret:1.0.0"},
		{Version: "1.0.0", Repository: "Registry/Egret"},
	} {
		o.Out, o.Helm = t.TempDir(), "/nonexistent/helm"
		if _, err := Make(o, io.Discard); err == nil || !strings.Contains(err.Error(), "want") {
			t.Errorf("Make(%+v): %v, want a refusal", o, err)
		}
	}
}

func grepImage(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "image:") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// chartFiles reads a chart package (.tgz) by path inside it.
func chartFiles(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[filepath.ToSlash(h.Name)] = b
	}
}
