package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Layout is an OCI layout archive as Read found it, every digest checked.
type Layout struct {
	// Name and Tag: the annotations of index.json's one entry.
	Name, Tag string
	// Digest is that entry's: an index's for WriteIndex, a manifest's
	// for Write.
	Digest    string
	MediaType string
	// Platforms are the image's manifests, in the index's order.
	Platforms []Platform
	// Blobs is the size of every blob by digest.
	Blobs map[string]int64
}

// Platform is one manifest of a layout, read through.
type Platform struct {
	Architecture, OS string // the index's platform
	Digest           string // the manifest's
	// ConfigArchitecture and ConfigOS are what the config says.
	ConfigArchitecture, ConfigOS string
	Entrypoint                   []string
	Labels                       map[string]string
	LayerMediaType               string
	LayerSize                    int64 // as stored (compressed or not)
	// Files are the layer's regular files by path ("egret"), and Dirs
	// its directories ("tmp").
	Files map[string][]byte
	Dirs  map[string]bool
}

// ErrLayout: an archive that is not a sound OCI layout (a digest or a
// size that does not match, a blob missing, a config for another
// platform).
var ErrLayout = errors.New("ociimage: bad layout")

// Read reads an OCI layout archive with one image (of one platform, or an
// index of several) and checks it: each blob's digest and size, each
// config's architecture and OS against its platform, each layer's diff_id.
func Read(r io.Reader) (*Layout, error) {
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files[strings.TrimPrefix(h.Name, "./")] = b
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrLayout, fmt.Sprintf(format, args...))
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		return nil, bad("oci-layout is %q", files["oci-layout"])
	}
	l := &Layout{Blobs: map[string]int64{}}
	for name, b := range files {
		if hex, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			if digest(b) != "sha256:"+hex {
				return nil, bad("blob %s holds content of digest %s", name, digest(b))
			}
			l.Blobs["sha256:"+hex] = int64(len(b))
		}
	}
	blob := func(d descriptor) ([]byte, error) {
		b, ok := files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		switch {
		case !ok || !strings.HasPrefix(d.Digest, "sha256:"):
			return nil, bad("no blob %s", d.Digest)
		case int64(len(b)) != d.Size:
			return nil, bad("blob %s is %d bytes, its descriptor says %d", d.Digest, len(b), d.Size)
		}
		return b, nil
	}
	var top struct{ Manifests []descriptor }
	if err := json.Unmarshal(files["index.json"], &top); err != nil || len(top.Manifests) != 1 {
		return nil, bad("index.json: %v, %d entries, want 1", err, len(top.Manifests))
	}
	e := top.Manifests[0]
	l.Name, l.Tag = e.Annotations["io.containerd.image.name"], e.Annotations["org.opencontainers.image.ref.name"]
	l.Digest, l.MediaType = e.Digest, e.MediaType
	descs := []descriptor{e}
	if e.MediaType == MediaIndex {
		b, err := blob(e)
		if err != nil {
			return nil, err
		}
		var inner struct {
			MediaType string
			Manifests []descriptor
		}
		if err := json.Unmarshal(b, &inner); err != nil || inner.MediaType != MediaIndex {
			return nil, bad("index %s: %v, media type %q", e.Digest, err, inner.MediaType)
		}
		descs = inner.Manifests
	}
	for _, d := range descs {
		p, err := readPlatform(d, blob)
		if err != nil {
			return nil, err
		}
		l.Platforms = append(l.Platforms, p)
	}
	return l, nil
}

func readPlatform(d descriptor, blob func(descriptor) ([]byte, error)) (Platform, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: manifest %s: %s", ErrLayout, d.Digest, fmt.Sprintf(format, args...))
	}
	if d.MediaType != MediaManifest || d.Platform == nil {
		return Platform{}, bad("media type %q, platform %v", d.MediaType, d.Platform)
	}
	p := Platform{Architecture: d.Platform.Architecture, OS: d.Platform.OS, Digest: d.Digest,
		Files: map[string][]byte{}, Dirs: map[string]bool{}}
	b, err := blob(d)
	if err != nil {
		return p, err
	}
	var m struct {
		Config descriptor
		Layers []descriptor
	}
	if err := json.Unmarshal(b, &m); err != nil || len(m.Layers) != 1 {
		return p, bad("%v, %d layers, want 1", err, len(m.Layers))
	}
	cb, err := blob(m.Config)
	if err != nil {
		return p, err
	}
	var cfg struct {
		Architecture, OS string
		Config           struct {
			Entrypoint []string
			Labels     map[string]string
		}
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return p, bad("config: %v", err)
	}
	p.ConfigArchitecture, p.ConfigOS = cfg.Architecture, cfg.OS
	p.Entrypoint, p.Labels = cfg.Config.Entrypoint, cfg.Config.Labels
	if p.ConfigArchitecture != p.Architecture || p.ConfigOS != p.OS {
		return p, bad("config is %s/%s, the index says %s/%s", p.ConfigOS, p.ConfigArchitecture, p.OS, p.Architecture)
	}
	layer, err := blob(m.Layers[0])
	if err != nil {
		return p, err
	}
	p.LayerMediaType, p.LayerSize = m.Layers[0].MediaType, int64(len(layer))
	switch p.LayerMediaType {
	case MediaLayer:
	case MediaLayerGz:
		zr, err := gzip.NewReader(bytes.NewReader(layer))
		if err != nil {
			return p, bad("layer: %v", err)
		}
		if layer, err = io.ReadAll(zr); err != nil {
			return p, bad("layer: %v", err)
		}
	default:
		return p, bad("layer media type %q", p.LayerMediaType)
	}
	if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != digest(layer) {
		return p, bad("diff_ids %v, the layer's tar is %s", cfg.RootFS.DiffIDs, digest(layer))
	}
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return p, nil
		}
		if err != nil {
			return p, bad("layer: %v", err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			p.Dirs[strings.TrimSuffix(h.Name, "/")] = true
		case tar.TypeReg:
			if p.Files[h.Name], err = io.ReadAll(tr); err != nil {
				return p, bad("layer: %v", err)
			}
		}
	}
}
