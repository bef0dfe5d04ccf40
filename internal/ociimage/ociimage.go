// Package ociimage writes a container image as an OCI image layout archive
// (a tar of oci-layout, index.json and blobs/sha256/…) with one
// uncompressed layer, without a registry, a daemon or a base image. The
// archive is what `ctr images import` and `podman load` take; egret's
// image for a node without a registry is one static binary in such an
// archive (deploy/image), and so are the images of test/kubenode.
//
// The output is reproducible: the same files give the same bytes (entries
// sorted, times zero, owner root).
package ociimage

import (
	"archive/tar"
	"bytes"
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
}

// Media types of the OCI image spec.
const (
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
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
	if img.Name == "" || !strings.Contains(img.Name, ":") {
		return "", fmt.Errorf("%w: name %q needs a tag (name:tag)", ErrImage, img.Name)
	}
	layer, err := layerTar(img.Files)
	if err != nil {
		return "", err
	}
	env := img.Env
	if env == nil {
		env = []string{"PATH=/"}
	}
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      time.Unix(0, 0).UTC(),
		"config": map[string]any{
			"Entrypoint": img.Entrypoint,
			"Cmd":        img.Cmd,
			"Env":        env,
			"Labels":     img.Labels,
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{digest(layer)}},
	})
	if err != nil {
		return "", err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        descriptor{MediaType: mediaConfig, Digest: digest(config), Size: int64(len(config))},
		"layers":        []descriptor{{MediaType: mediaLayer, Digest: digest(layer), Size: int64(len(layer))}},
	})
	if err != nil {
		return "", err
	}
	tag := img.Name[strings.LastIndex(img.Name, ":")+1:]
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []descriptor{{
			MediaType: mediaManifest, Digest: digest(manifest), Size: int64(len(manifest)),
			Annotations: map[string]string{
				"io.containerd.image.name":          img.Name,
				"org.opencontainers.image.ref.name": tag,
			},
			Platform: &platform{Architecture: "amd64", OS: "linux"},
		}},
	})
	if err != nil {
		return "", err
	}
	tw := tar.NewWriter(w)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
	}
	for _, b := range [][]byte{config, layer, manifest} {
		entries = append(entries, struct {
			name string
			data []byte
		}{"blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:"), b})
	}
	for _, d := range []string{"blobs", "blobs/sha256"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
			return "", err
		}
	}
	for _, e := range entries {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: time.Unix(0, 0)}); err != nil {
			return "", err
		}
		if _, err := tw.Write(e.data); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return digest(manifest), nil
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
