// Package ociimage writes a container image as an OCI image layout archive
// (a tar of oci-layout, index.json and blobs/sha256/…) with one layer,
// without a registry, a daemon or a base image. `ctr images import` takes
// the archive (deploy/image/imagebuild tests it with an index); `podman
// load` and (Docker 25 or later) `docker load` are said to take it, and
// `skopeo copy oci-archive:…` and `oras cp --from-oci-layout` to push it
// to a registry (untested); `crane push` of the layout untarred is tested
// (deploy/image/imagebuild's TestImageIndexPush).
// Write makes a one-platform image (the images of test/kubenode);
// WriteIndex an image index of several platforms under one name (egret's
// image, deploy/image).
//
// The output is reproducible: the same files give the same bytes (entries
// sorted, times zero, owner root).
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"
)

// ErrImage: an Image that cannot be written (the error says why).
var ErrImage = errors.New("ociimage: bad image")

// File is one regular file or directory of the image's filesystem.
type File struct {
	// Path is absolute, for example "/egret". Parent directories are
	// added as needed (mode 0755).
	Path string
	// Mode is the permission bits (0755 for a program).
	Mode int64
	// Data is the content; nil with Dir.
	Data []byte
	// Dir makes a directory instead of a file.
	Dir bool
}

// Image is what Write puts in the archive.
type Image struct {
	// Name is the reference containerd stores it under, for example
	// "ghcr.io/egret-proxy/egret:0.1.0" (io.containerd.image.name).
	Name string
	// Files are the image's filesystem.
	Files []File
	// Entrypoint and Cmd as in a Containerfile's ENTRYPOINT and CMD.
	Entrypoint, Cmd []string
	// Env defaults to PATH=/.
	Env []string
	// Labels of the image config (for example
	// org.opencontainers.image.version).
	Labels map[string]string
	// Architecture is the platform's, as GOARCH names it ("amd64",
	// "arm64"); empty: amd64. The OS is linux.
	Architecture string
	// Gzip compresses the layer (tar+gzip), as registries usually hold
	// them; the config's diff_id stays the digest of the tar.
	Gzip bool
}

// Media types of the OCI image spec.
const (
	MediaIndex    = "application/vnd.oci.image.index.v1+json"
	MediaManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaConfig   = "application/vnd.oci.image.config.v1+json"
	MediaLayer    = "application/vnd.oci.image.layer.v1.tar"
	MediaLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Write writes img's archive to w and returns the manifest's digest
// ("sha256:…").
func Write(w io.Writer, img Image) (string, error) {
	if err := checkName(img.Name); err != nil {
		return "", err
	}
	m, err := manifestOf(img)
	if err != nil {
		return "", err
	}
	top := m.desc
	top.Annotations = nameAnnotations(img.Name)
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []descriptor{top}})
	if err != nil {
		return "", err
	}
	return top.Digest, writeLayout(w, index, m.blobs)
}

// WriteIndex writes one image of several platforms to w: an image index
// named name whose manifests are those of imgs (their Names are not used;
// one per architecture). It returns the index's digest, the one a
// registry gives the pushed image.
func WriteIndex(w io.Writer, name string, imgs []Image) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	if len(imgs) == 0 {
		return "", fmt.Errorf("%w: an index of no image", ErrImage)
	}
	seen := map[string]bool{}
	var descs []descriptor
	var blobs [][]byte
	for _, img := range imgs {
		m, err := manifestOf(img)
		if err != nil {
			return "", err
		}
		if seen[m.desc.Platform.Architecture] {
			return "", fmt.Errorf("%w: architecture %s given twice", ErrImage, m.desc.Platform.Architecture)
		}
		seen[m.desc.Platform.Architecture] = true
		descs = append(descs, m.desc)
		blobs = append(blobs, m.blobs...)
	}
	inner, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": MediaIndex, "manifests": descs})
	if err != nil {
		return "", err
	}
	blobs = append(blobs, inner)
	top := descriptor{MediaType: MediaIndex, Digest: digest(inner), Size: int64(len(inner)), Annotations: nameAnnotations(name)}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []descriptor{top}})
	if err != nil {
		return "", err
	}
	return top.Digest, writeLayout(w, index, blobs)
}

func checkName(name string) error {
	if name == "" || !strings.Contains(name, ":") || strings.LastIndex(name, ":") < strings.LastIndex(name, "/") {
		return fmt.Errorf("%w: name %q needs a tag (name:tag)", ErrImage, name)
	}
	return nil
}

// nameAnnotations name the layout's image: containerd's full reference,
// and the OCI layout's tag (what skopeo's oci-archive:FILE:TAG takes).
func nameAnnotations(name string) map[string]string {
	return map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:],
	}
}

// manifest is one platform's manifest: its descriptor and its blobs
// (config, layer, manifest).
type manifest struct {
	desc  descriptor
	blobs [][]byte
}

func manifestOf(img Image) (manifest, error) {
	arch := img.Architecture
	if arch == "" {
		arch = "amd64"
	}
	layer, err := layerTar(img.Files)
	if err != nil {
		return manifest{}, err
	}
	diffID := digest(layer)
	media := MediaLayer
	if img.Gzip {
		if layer, err = gzipped(layer); err != nil {
			return manifest{}, err
		}
		media = MediaLayerGz
	}
	env := img.Env
	if env == nil {
		env = []string{"PATH=/"}
	}
	config, err := json.Marshal(map[string]any{
		"architecture": arch,
		"os":           "linux",
		"created":      time.Unix(0, 0).UTC(),
		"config": map[string]any{
			"Entrypoint": img.Entrypoint,
			"Cmd":        img.Cmd,
			"Env":        env,
			"Labels":     img.Labels,
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return manifest{}, err
	}
	m, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     MediaManifest,
		"config":        descriptor{MediaType: MediaConfig, Digest: digest(config), Size: int64(len(config))},
		"layers":        []descriptor{{MediaType: media, Digest: digest(layer), Size: int64(len(layer))}},
	})
	if err != nil {
		return manifest{}, err
	}
	return manifest{
		desc:  descriptor{MediaType: MediaManifest, Digest: digest(m), Size: int64(len(m)), Platform: &platform{Architecture: arch, OS: "linux"}},
		blobs: [][]byte{config, layer, m},
	}, nil
}

// gzipped is b compressed the same way every time (no name, no time).
func gzipped(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeLayout writes the layout's tar: oci-layout, index.json, then each
// blob once, named by its digest.
func writeLayout(w io.Writer, index []byte, blobs [][]byte) error {
	tw := tar.NewWriter(w)
	for _, d := range []string{"blobs", "blobs/sha256"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
	}
	file := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := file("index.json", index); err != nil {
		return err
	}
	written := map[string]bool{}
	for _, b := range blobs {
		d := digest(b)
		if written[d] {
			continue
		}
		written[d] = true
		if err := file("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), b); err != nil {
			return err
		}
	}
	return tw.Close()
}

func digest(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// layerTar is the layer: img's files and their parent directories, sorted.
func layerTar(files []File) ([]byte, error) {
	type entry struct {
		File
		name string
	}
	byName := map[string]entry{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("%w: path %q is not a clean absolute file path", ErrImage, f.Path)
		}
		name := strings.TrimPrefix(f.Path, "/")
		if _, dup := byName[name]; dup {
			return nil, fmt.Errorf("%w: %s given twice", ErrImage, f.Path)
		}
		if f.Dir && f.Data != nil {
			return nil, fmt.Errorf("%w: directory %s has data", ErrImage, f.Path)
		}
		byName[name] = entry{f, name}
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if e, ok := byName[d]; ok && !e.Dir {
				return nil, fmt.Errorf("%w: %s is a file and a directory", ErrImage, "/"+d)
			}
			if _, ok := byName[d]; !ok {
				byName[d] = entry{File{Path: "/" + d, Mode: 0o755, Dir: true}, d}
			}
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := byName[n]
		h := &tar.Header{Name: n, Mode: e.Mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if e.Dir {
			h.Typeflag, h.Name = tar.TypeDir, n+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if !e.Dir {
			if _, err := tw.Write(e.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
