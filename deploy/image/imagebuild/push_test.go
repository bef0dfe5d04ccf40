package imagebuild

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/egret-proxy/egret/internal/ociimage"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/internal/testkit/toolbuild"
)

// TestImageIndexPush: the archive TestImageIndex inspects is pushable to a
// registry with crane (go-containerregistry's CLI, built from
// deploy/image/imagebuild/tools), as deploy/README.md says: the archive
// untarred is an OCI layout, `crane push DIR 127.0.0.1:PORT/egret:TAG`
// pushes index.json's one entry, the index, with all it refers to, to a
// registry on loopback (go-containerregistry's pkg/registry, in process).
// The registry then serves, over its HTTP API, the tag as the archive's
// index byte for byte with its digest, and every blob of the archive (each
// platform's manifest, config and layer) byte for byte; `crane digest
// --platform` resolves each platform to its manifest. Then, as root, a
// containerd of the test's own pulls it back (`ctr images pull
// --plain-http --all-platforms`): the index under the tag, every blob.
// crane reads index.json's one entry without --index; with --index it
// would push index.json itself, an index of the index.
func TestImageIndexPush(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles egret twice")
	}
	crane := craneBinary(t)
	archive, digest := testIndex(t)
	l := readLayout(t, archive)
	blobs, err := archiveBlobs(archive)
	if err != nil {
		t.Fatal(err)
	}
	layout := filepath.Join(t.TempDir(), "layout")
	if err := untar(archive, layout); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(testLogger(t)))}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("registry: %v", err)
		}
	})
	host := ln.Addr().String()
	ref := host + "/egret:" + testTag

	start := time.Now()
	out, logs, err := run(crane, "push", "--insecure", layout, ref)
	if err != nil {
		t.Fatalf("crane push: %v: %s", err, logs)
	}
	var size int
	for _, b := range blobs {
		size += len(b)
	}
	t.Logf("crane push %s %s: %.1fs, %d blobs, %.1f MB: %s\n%s", layout, ref, time.Since(start).Seconds(), len(blobs), float64(size)/1e6, out, logs)
	if got, want := strings.TrimSpace(string(out)), host+"/egret@"+digest; got != want {
		t.Errorf("crane push printed %q, want %q", got, want)
	}

	// The registry's side, over its HTTP API: the tag is the index.
	body, hdr := get(t, "http://"+host+"/v2/egret/manifests/"+testTag, ociimage.MediaIndex)
	if ct := hdr.Get("Content-Type"); ct != ociimage.MediaIndex {
		t.Errorf("the tag's manifest is %s, want an index %s", ct, ociimage.MediaIndex)
	}
	if d := hdr.Get("Docker-Content-Digest"); d != digest {
		t.Errorf("the tag's digest is %s, want the archive's %s", d, digest)
	}
	if !bytes.Equal(body, blobs[digest]) {
		t.Errorf("the tag's manifest (%d bytes) is not the archive's index (%d bytes)", len(body), len(blobs[digest]))
	}
	var index struct {
		Manifests []struct {
			Digest   string
			Platform struct{ OS, Architecture string }
		}
	}
	if err := json.Unmarshal(body, &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != len(l.Platforms) {
		t.Fatalf("the pushed index has %d manifests, want %d", len(index.Manifests), len(l.Platforms))
	}

	// Every blob of the archive: the manifests (by digest) and each
	// manifest's config and layer.
	for d, want := range blobs {
		if d == digest {
			continue
		}
		isManifest := false
		for _, m := range index.Manifests {
			isManifest = isManifest || m.Digest == d
		}
		var got []byte
		if isManifest {
			got, _ = get(t, "http://"+host+"/v2/egret/manifests/"+d, ociimage.MediaManifest)
		} else {
			got, _ = get(t, "http://"+host+"/v2/egret/blobs/"+d, "")
		}
		if !bytes.Equal(got, want) {
			t.Errorf("the registry serves %s as %d bytes, not the archive's %d", d, len(got), len(want))
		}
		if sum := sha256.Sum256(got); "sha256:"+hex.EncodeToString(sum[:]) != d {
			t.Errorf("the registry serves %s with another digest", d)
		}
	}

	// A puller that asks for one platform gets its manifest.
	for _, p := range l.Platforms {
		platform := p.OS + "/" + p.Architecture
		out, logs, err := run(crane, "digest", "--insecure", "--platform", platform, ref)
		if err != nil {
			t.Fatalf("crane digest --platform %s: %v: %s", platform, err, logs)
		}
		if got := strings.TrimSpace(string(out)); got != p.Digest {
			t.Errorf("crane digest --platform %s: %s, want the archive's manifest %s", platform, got, p.Digest)
		}
	}

	// A node pulls what was pushed: a containerd of the test's own (as in
	// TestImageIndexInContainerd) pulls the tag, all platforms, over plain
	// HTTP, and holds the index under the tag and every blob byte for byte.
	t.Run("containerd pull", func(t *testing.T) {
		testenv.RequireRoot(t)
		for _, c := range []string{"containerd", "ctr", "unshare", "nsenter", "umount"} {
			_, err := exec.LookPath(c)
			testenv.Require(t, err == nil, c+" (apt-get install containerd runc util-linux)")
		}
		c := startContainerd(t)
		start := time.Now()
		out, err := c.ctr("images", "pull", "--plain-http", "--all-platforms", ref)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("ctr images pull --plain-http --all-platforms %s: %.1fs\n%s", ref, time.Since(start).Seconds(), out)
		c.expectImage(t, ref, digest, blobs)
	})
}

// run runs a command and returns its standard output and its standard
// error apart (crane logs to the latter, prints its answer on the former).
func run(name string, args ...string) (stdout, stderr []byte, err error) {
	var o, e bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.Bytes(), e.Bytes(), err
}

// get returns the body and header of a GET of url (Accept: accept, if
// any), failing the test on anything but 200.
func get(t *testing.T, url, accept string) ([]byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, body)
	}
	return body, resp.Header
}

// untar writes the regular files and directories of the tar at path under
// dir (what crane reads as an OCI layout).
func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(h.Name, "/")
		switch h.Typeflag {
		case tar.TypeDir:
			err = root.MkdirAll(name, 0o755)
		case tar.TypeReg:
			if d := filepath.Dir(name); d != "." {
				if err := root.MkdirAll(d, 0o755); err != nil {
					return err
				}
			}
			var w *os.File
			if w, err = root.Create(name); err == nil {
				_, err = io.Copy(w, tr)
				err = errors.Join(err, w.Close())
			}
		default:
			err = fmt.Errorf("%s: tar type %c in an OCI layout", h.Name, h.Typeflag)
		}
		if err != nil {
			return err
		}
	}
}

// testLogger is the registry's log, into the test's.
func testLogger(t *testing.T) *log.Logger {
	return log.New(testWriter{t}, "registry: ", 0)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}

// craneBinary returns crane, built from the tools module beside this file
// (go-containerregistry's cmd/crane at the version its go.mod pins) once
// per machine and cached (internal/testkit/toolbuild). A failed build
// skips the test, or fails it under CI.
func craneBinary(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "tools")
	m := toolbuild.Module{Name: "crane", Dir: dir, LDFlags: func() (string, error) {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			return "", err
		}
		v := toolbuild.ModVersion(mod, "github.com/google/go-containerregistry")
		if v == "" {
			return "", fmt.Errorf("%s/go.mod requires no github.com/google/go-containerregistry", dir)
		}
		return "-X github.com/google/go-containerregistry/cmd/crane/cmd.Version=" + v, nil
	}, BuildArgs: []string{"-trimpath"}, Env: []string{"CGO_ENABLED=0"}, Readme: "deploy/README.md"}
	paths, err := m.Build(toolbuild.Program{Pkg: "github.com/google/go-containerregistry/cmd/crane", Out: "crane", Name: "crane"})
	testenv.Require(t, err == nil, fmt.Sprintf("crane built from %s: %v", dir, err))
	return paths["crane"]
}
