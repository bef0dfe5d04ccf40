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
