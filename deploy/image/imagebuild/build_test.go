package imagebuild

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/egret-proxy/egret/internal/ociimage"
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
		got, err := TagOf(name)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("TagOf(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
}

// TestImageIndex: the image Build writes offline (GOPROXY=off, no
// emulator) is one OCI image index named as asked with a manifest for
// linux/amd64 and one for linux/arm64; ociimage.Read checks every blob's
// digest and size, each config's architecture against its platform and
// each layer's diff_id. Each layer's /egret is a static ELF for its
// machine, labelled and stamped with the version: the amd64 one, run
// here, prints it.
func TestImageIndex(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles egret twice")
	}
	const tag = testTag
	out, digest := testIndex(t)
	l := readLayout(t, out)
	if l.Name != "registry.test/egret:"+tag || l.Tag != tag || l.MediaType != ociimage.MediaIndex || l.Digest != digest {
		t.Fatalf("layout %s %s %s %s, want an index named registry.test/egret:%s of digest %s", l.Name, l.Tag, l.MediaType, l.Digest, tag, digest)
	}
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	if len(l.Platforms) != 2 {
		t.Fatalf("%d platforms, want linux/amd64 and linux/arm64", len(l.Platforms))
	}
	for i, p := range l.Platforms {
		want := strings.TrimPrefix(DefaultPlatforms[i], "linux/")
		t.Logf("%s/%s: manifest %s, layer %s %.1f MB", p.OS, p.Architecture, p.Digest, p.LayerMediaType, float64(p.LayerSize)/1e6)
		if p.OS != "linux" || p.Architecture != want || p.ConfigArchitecture != want || p.LayerMediaType != ociimage.MediaLayerGz {
			t.Errorf("platform %d: %s/%s (config %s), layer %s; want linux/%s, gzipped", i, p.OS, p.Architecture, p.ConfigArchitecture, p.LayerMediaType, want)
		}
		if got := p.Labels["org.opencontainers.image.version"]; got != tag {
			t.Errorf("%s: label org.opencontainers.image.version %q, want %q", want, got, tag)
		}
		if len(p.Entrypoint) != 1 || p.Entrypoint[0] != "/egret" {
			t.Errorf("%s: entrypoint %q", want, p.Entrypoint)
		}
		for _, d := range []string{"tmp", "run/egret", "etc/egret", "sys", "proc", "dev"} {
			if !p.Dirs[d] {
				t.Errorf("%s: no /%s in the layer (a mount point)", want, d)
			}
		}
		bin, ok := p.Files["egret"]
		if !ok {
			t.Fatalf("%s: no /egret in the layer", want)
		}
		ef, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatalf("%s: /egret: %v", want, err)
		}
		for _, prog := range ef.Progs {
			if prog.Type == elf.PT_INTERP {
				t.Errorf("%s: /egret asks for a dynamic loader: not static", want)
			}
		}
		if ef.Machine != machine[want] {
			t.Errorf("%s: /egret is for %v, want %v", want, ef.Machine, machine[want])
		}
		if !bytes.Contains(bin, []byte(tag)) {
			t.Errorf("%s: /egret does not hold its version %s", want, tag)
		}
		if want != runtime.GOARCH {
			continue
		}
		exe := filepath.Join(t.TempDir(), "egret")
		if err := os.WriteFile(exe, bin, 0o755); err != nil {
			t.Fatal(err)
		}
		got, err := exec.Command(exe, "--version").CombinedOutput()
		if err != nil {
			t.Fatalf("/egret --version: %v: %s", err, got)
		}
		if re := versionLine(tag, want); !re.Match(got) {
			t.Errorf("/egret --version printed %q, want %v", got, re)
		}
	}
}

// testTag is the tag of the index the tests build (testIndex).
const testTag = "v9.8.7-test.1"

// index is the image index archive the tests share: Build cross-compiles
// egret twice (minutes cold), so TestImageIndex and
// TestImageIndexInContainerd inspect one archive. TestMain removes its
// directory.
var index struct {
	once              sync.Once
	dir, path, digest string
	log               string
	err               error
}

// readLayout reads the OCI layout archive at path.
func readLayout(t *testing.T, path string) *ociimage.Layout {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := ociimage.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testIndex returns the archive of registry.test/egret:testTag, for
// DefaultPlatforms, and its digest, built offline (GOPROXY=off, no
// emulator) by the first test that asks for it.
func testIndex(t *testing.T) (path, digest string) {
	t.Helper()
	t.Setenv("GOPROXY", "off") // what the module cache holds, nothing fetched
	t.Setenv("GOFLAGS", "-mod=readonly")
	built := false
	index.once.Do(func() {
		built = true
		if index.dir, index.err = os.MkdirTemp("", "egret-imagebuild-test-"); index.err != nil {
			return
		}
		index.path = filepath.Join(index.dir, "egret.tar")
		var log strings.Builder
		index.digest, index.err = Build(index.path, "registry.test/egret:"+testTag, "", DefaultPlatforms, &log)
		index.log = log.String()
	})
	if index.err != nil {
		t.Fatalf("building the image index: %v", index.err)
	}
	if built {
		t.Logf("%s", index.log)
	} else {
		t.Logf("the image index an earlier test built: %s", index.path)
	}
	return index.path, index.digest
}

func TestMain(m *testing.M) {
	code := m.Run()
	if index.dir != "" {
		if err := os.RemoveAll(index.dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// versionLine matches what `egret --version` prints, as `go version`
// does: egret version TAG goVERSION linux/ARCH.
func versionLine(tag, arch string) *regexp.Regexp {
	return regexp.MustCompile(`^egret version ` + regexp.QuoteMeta(tag) + ` go\S+ linux/` + arch + `\n$`)
}

func TestArchsOf(t *testing.T) {
	if a, err := archsOf([]string{"linux/arm64", " linux/amd64"}); err != nil || strings.Join(a, ",") != "arm64,amd64" {
		t.Errorf("archsOf: %v %v", a, err)
	}
	for _, bad := range [][]string{{}, {"linux/riscv64"}, {"darwin/arm64"}, {"arm64"}, {"linux/amd64", "linux/amd64"}} {
		if _, err := archsOf(bad); err == nil {
			t.Errorf("archsOf(%q): no error", bad)
		}
	}
}

// The tag the manifests run is the one this command names by default, and
// the Helm chart's appVersion.
func TestDefaultNameIsTheManifestsTag(t *testing.T) {
	tag, err := TagOf(DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, line string }{
		{"../../kubernetes/daemonset.yaml", "image: " + DefaultName},
		{"../../kubernetes/kustomization.yaml", "newTag: " + tag},
		{"../../helm/egret/Chart.yaml", `appVersion: "` + tag + `"`},
		{"../../Containerfile", "ARG VERSION=" + tag},
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
	b, _ := os.ReadFile("../../Containerfile")
	if !bytes.Contains(b, []byte("-X "+versionVar+"=${VERSION}")) {
		t.Errorf("the Containerfile does not stamp %s with ${VERSION}", versionVar)
	}
}
