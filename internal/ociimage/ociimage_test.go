package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func readTar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		out[h.Name] = data
	}
}

// The archive is an OCI image layout whose digests check out, named as
// asked, with the files (and their parent directories) in its layer; the
// same image gives the same bytes.
func TestWriteLayout(t *testing.T) {
	img := Image{
		Name:       "example.test/egret:1",
		Files:      []File{{Path: "/bin/egret", Mode: 0o755, Data: []byte("ELF")}, {Path: "/tmp", Mode: 0o1777, Dir: true}},
		Entrypoint: []string{"/bin/egret"},
	}
	var a, b bytes.Buffer
	da, err := Write(&a, img)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Write(&b, img)
	if err != nil {
		t.Fatal(err)
	}
	if da != db || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two writes of one image differ")
	}
	files := readTar(t, a.Bytes())
	blob := func(d string) []byte {
		data, ok := files["blobs/sha256/"+strings.TrimPrefix(d, "sha256:")]
		if !ok {
			t.Fatalf("no blob %s", d)
		}
		sum := sha256.Sum256(data)
		if "sha256:"+hex.EncodeToString(sum[:]) != d {
			t.Fatalf("blob %s has another digest", d)
		}
		return data
	}
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v %+v", err, index)
	}
	if index.Manifests[0].Digest != da || index.Manifests[0].Annotations["io.containerd.image.name"] != img.Name {
		t.Fatalf("index: %+v", index.Manifests[0])
	}
	var m struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	if err := json.Unmarshal(blob(da), &m); err != nil || len(m.Layers) != 1 {
		t.Fatalf("manifest: %v %+v", err, m)
	}
	var cfg struct {
		Config struct{ Entrypoint []string }
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(blob(m.Config.Digest), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Config.Entrypoint[0] != "/bin/egret" || cfg.RootFS.DiffIDs[0] != m.Layers[0].Digest {
		t.Fatalf("config: %+v", cfg)
	}
	layer := readTar(t, blob(m.Layers[0].Digest))
	for _, want := range []string{"bin/", "bin/egret", "tmp/"} {
		if _, ok := layer[want]; !ok {
			t.Errorf("layer lacks %s (has %v)", want, layer)
		}
	}
	if string(layer["bin/egret"]) != "ELF" {
		t.Errorf("bin/egret = %q", layer["bin/egret"])
	}
}

func TestWriteRefusesBadImages(t *testing.T) {
	for name, img := range map[string]Image{
		"no tag":        {Name: "egret"},
		"relative path": {Name: "e:1", Files: []File{{Path: "egret"}}},
		"unclean path":  {Name: "e:1", Files: []File{{Path: "/a/../egret"}}},
		"twice":         {Name: "e:1", Files: []File{{Path: "/a"}, {Path: "/a"}}},
		"file and dir":  {Name: "e:1", Files: []File{{Path: "/a"}, {Path: "/a/b"}}},
	} {
		if _, err := Write(io.Discard, img); !errors.Is(err, ErrImage) {
			t.Errorf("%s: %v, want ErrImage", name, err)
		}
	}
}

// An index of two platforms: one name, an image index whose manifests
// carry each platform, each config the same architecture, each gzipped
// layer's diff_id the digest of its tar and its files those given; Read
// checks every digest and size. The same images give the same bytes.
func TestWriteIndex(t *testing.T) {
	imgs := []Image{
		{Architecture: "amd64", Gzip: true, Entrypoint: []string{"/egret"},
			Files: []File{{Path: "/egret", Mode: 0o755, Data: []byte("amd64 ELF")}, {Path: "/tmp", Mode: 0o1777, Dir: true}}},
		{Architecture: "arm64", Gzip: true, Entrypoint: []string{"/egret"},
			Files: []File{{Path: "/egret", Mode: 0o755, Data: []byte("arm64 ELF")}, {Path: "/tmp", Mode: 0o1777, Dir: true}}},
	}
	var a, b bytes.Buffer
	da, err := WriteIndex(&a, "example.test/egret:1.2", imgs)
	if err != nil {
		t.Fatal(err)
	}
	if db, err := WriteIndex(&b, "example.test/egret:1.2", imgs); err != nil || db != da || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatalf("two writes of one index differ (%v)", err)
	}
	l, err := Read(bytes.NewReader(a.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if l.Name != "example.test/egret:1.2" || l.Tag != "1.2" || l.Digest != da || l.MediaType != MediaIndex || len(l.Platforms) != 2 {
		t.Fatalf("layout %+v", l)
	}
	for i, p := range l.Platforms {
		arch := imgs[i].Architecture
		if p.Architecture != arch || p.OS != "linux" || p.ConfigArchitecture != arch || p.LayerMediaType != MediaLayerGz {
			t.Errorf("platform %d: %+v", i, p)
		}
		if string(p.Files["egret"]) != arch+" ELF" || !p.Dirs["tmp"] {
			t.Errorf("%s layer: files %v dirs %v", arch, p.Files, p.Dirs)
		}
	}

	// Read refuses a blob whose content is not its digest's.
	files := readTar(t, a.Bytes())
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for name, data := range files {
		if strings.HasPrefix(name, "blobs/sha256/") && bytes.Contains(data, []byte(`"architecture":"arm64"`)) {
			data = bytes.Replace(data, []byte(`"architecture":"arm64"`), []byte(`"architecture":"arm32"`), 1)
		}
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(data)), Mode: 0o644})
		tw.Write(data)
	}
	tw.Close()
	if _, err := Read(&out); !errors.Is(err, ErrLayout) {
		t.Errorf("a tampered config: %v, want ErrLayout", err)
	}
	if _, err := WriteIndex(io.Discard, "e:1", []Image{{Architecture: "arm64"}, {Architecture: "arm64"}}); !errors.Is(err, ErrImage) {
		t.Errorf("one architecture twice: %v, want ErrImage", err)
	}
}
