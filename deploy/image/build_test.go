package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestTagOf(t *testing.T) {
	for name, want := range map[string]string{
		DefaultName:                          "0.1.0",
		"registry.local:5000/egret:v1.2.3":   "v1.2.3",
		"egret:dev":                          "dev",
		"registry.local:5000/egret":          "",
		"egret":                              "",
		"egret:":                             "",
		"ghcr.io/egret-proxy/egret@sha256:0": "",
	} {
		got, err := tagOf(name)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("tagOf(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
}

// readTar returns the regular files of a tar archive by name.
func readTar(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(h.Name, "./")] = b
	}
}

// blob returns the content of the layout's blob named by digest.
func blob(t *testing.T, layout map[string][]byte, digest string) []byte {
	t.Helper()
	b, ok := layout["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok || !strings.HasPrefix(digest, "sha256:") {
		t.Fatalf("no blob %s in the archive", digest)
	}
	return b
}

// The image `go run ./deploy/image` writes says its version twice, in the
// config's labels and in the binary: /egret --version, run from the
// archive's layer, prints the tag.
func TestImageVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds egret")
	}
	const tag = "v9.8.7-test.1"
	out := filepath.Join(t.TempDir(), "egret.tar")
	if err := build(out, "registry.test/egret:"+tag, ""); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	layout := readTar(t, f)

	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(layout["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d manifests", err, len(index.Manifests))
	}
	var manifest struct {
		Config struct{ Digest string }   `json:"config"`
		Layers []struct{ Digest string } `json:"layers"`
	}
	if err := json.Unmarshal(blob(t, layout, index.Manifests[0].Digest), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v, %d layers", err, len(manifest.Layers))
	}
	var config struct {
		Config struct {
			Entrypoint []string          `json:"Entrypoint"`
			Labels     map[string]string `json:"Labels"`
		} `json:"config"`
	}
	if err := json.Unmarshal(blob(t, layout, manifest.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	if got := config.Config.Labels["org.opencontainers.image.version"]; got != tag {
		t.Errorf("label org.opencontainers.image.version %q, want %q (labels %v)", got, tag, config.Config.Labels)
	}
	if len(config.Config.Entrypoint) != 1 || config.Config.Entrypoint[0] != "/egret" {
		t.Fatalf("entrypoint %q", config.Config.Entrypoint)
	}

	rootfs := readTar(t, bytes.NewReader(blob(t, layout, manifest.Layers[0].Digest)))
	bin, ok := rootfs["egret"]
	if !ok {
		t.Fatal("no /egret in the image's layer")
	}
	exe := filepath.Join(t.TempDir(), "egret")
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := exec.Command(exe, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("/egret --version: %v: %s", err, got)
	}
	// As `go version`: egret version TAG goVERSION linux/amd64.
	if want := regexp.MustCompile(`^egret version ` + regexp.QuoteMeta(tag) + ` go\S+ linux/amd64\n$`); !want.Match(got) {
		t.Errorf("/egret --version printed %q, want %v", got, want)
	}
}

// The tag the manifests run is the one this command names by default, and
// the Helm chart's appVersion.
func TestDefaultNameIsTheManifestsTag(t *testing.T) {
	tag, err := tagOf(DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, line string }{
		{"../kubernetes/daemonset.yaml", "image: " + DefaultName},
		{"../kubernetes/kustomization.yaml", "newTag: " + tag},
		{"../helm/egret/Chart.yaml", `appVersion: "` + tag + `"`},
		{"../Containerfile", "ARG VERSION=" + tag},
	} {
		b, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(c.line) + `\s*$`).Match(b) {
			t.Errorf("%s has no line %q", c.file, c.line)
		}
	}
	// The Containerfile stamps the same variable.
	b, _ := os.ReadFile("../Containerfile")
	if !bytes.Contains(b, []byte("-X "+versionVar+"=${VERSION}")) {
		t.Errorf("the Containerfile does not stamp %s with ${VERSION}", versionVar)
	}
}
