// Package imagebuild builds egret's container image: egret cross-compiled
// for each platform, in an OCI image index archive (internal/ociimage).
// `go run ./deploy/image` and `go run ./deploy/release` call it.
package imagebuild

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/egret-proxy/egret/internal/ociimage"
)

// DefaultName is the image deploy/kubernetes/daemonset.yaml runs.
const DefaultName = "ghcr.io/egret-proxy/egret:0.1.0"

// DefaultPlatforms are the platforms egret's image is built for.
var DefaultPlatforms = []string{"linux/amd64", "linux/arm64"}

// Build cross-compiles egret for each platform and writes the image index
// archive to out, saying on log what it built; it returns the index's
// digest. An empty version is the tag of name.
func Build(out, name, version string, platforms []string, log io.Writer) (string, error) {
	if version == "" {
		var err error
		if version, err = TagOf(name); err != nil {
			return "", err
		}
	} else if _, err := TagOf(name); err != nil {
		return "", err
	}
	archs, err := archsOf(platforms)
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp("", "egret-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	var bins []string
	for _, arch := range archs {
		start := time.Now()
		bin := filepath.Join(tmp, "egret-"+arch)
		if err := buildBinary(bin, version, arch); err != nil {
			return "", err
		}
		st, err := os.Stat(bin)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(log, "egret for linux/%s: %.1f MB in %.1fs\n", arch, float64(st.Size())/1e6, time.Since(start).Seconds())
		bins = append(bins, bin)
	}
	digest, err := writeImage(out, name, version, archs, bins)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(out)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(log, "%s: %s %s (%s), %.1f MB\n", out, name, digest, strings.Join(platforms, ", "), float64(st.Size())/1e6)
	return digest, nil
}

// versionVar is the variable -ldflags -X stamps egret's version into
// (cmd/egret/cli.Version, printed by `egret --version`).
const versionVar = "github.com/egret-proxy/egret/cmd/egret/cli.Version"

// TagOf returns the tag of an image reference: "0.1.0" of
// "ghcr.io/egret-proxy/egret:0.1.0". A reference without a tag (a colon in
// the registry's host:port is not one) or with a digest is an error.
func TagOf(name string) (string, error) {
	if strings.Contains(name, "@") {
		return "", fmt.Errorf("-name %q: a digest cannot name an image being built; give name:tag", name)
	}
	i := strings.LastIndex(name, ":")
	if i < 0 || i < strings.LastIndex(name, "/") || i == len(name)-1 {
		return "", fmt.Errorf("-name %q has no tag; give name:tag", name)
	}
	return name[i+1:], nil
}

// archsOf returns the GOARCH of each platform ("linux/arm64"): linux
// only, each once, amd64 or arm64 (the kernels egret's eBPF is built and
// tested for).
func archsOf(platforms []string) ([]string, error) {
	var archs []string
	seen := map[string]bool{}
	for _, p := range platforms {
		arch, ok := strings.CutPrefix(strings.TrimSpace(p), "linux/")
		switch {
		case !ok || (arch != "amd64" && arch != "arm64"):
			return nil, fmt.Errorf("-platforms: %q: want linux/amd64 or linux/arm64", p)
		case seen[arch]:
			return nil, fmt.Errorf("-platforms: %s given twice", p)
		}
		seen[arch] = true
		archs = append(archs, arch)
	}
	if len(archs) == 0 {
		return nil, errors.New("-platforms: none given")
	}
	return archs, nil
}

// buildBinary cross-compiles cmd/egret for linux/arch as a static binary
// at out (the working directory must be in egret's module), with version
// stamped in. No emulator: cgo is off, so go build alone makes it.
func buildBinary(out, version, arch string) error {
	if version == "" || strings.ContainsAny(version, " \t\n'\"") {
		return errors.New("the version must be one word")
	}
	cmd := exec.Command("go", "build", "-trimpath",
		"-ldflags", "-s -w -X "+versionVar+"="+version,
		"-o", out, "github.com/egret-proxy/egret/cmd/egret")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v: %s", err, b)
	}
	return nil
}

// writeImage writes the image index archive of the egret binaries bins
// (one per arch) to out, labelled with version, and returns its digest.
func writeImage(out, name, version string, archs, bins []string) (string, error) {
	var imgs []ociimage.Image
	for i, bin := range bins {
		data, err := os.ReadFile(bin)
		if err != nil {
			return "", err
		}
		imgs = append(imgs, ociimage.Image{
			Architecture: archs[i],
			Gzip:         true,
			Files: []ociimage.File{
				{Path: "/egret", Mode: 0o755, Data: data},
				// Mount points of the DaemonSet (a read-only root filesystem
				// cannot get them made at run time).
				{Path: "/tmp", Mode: 0o1777, Dir: true},
				{Path: "/run/egret", Mode: 0o755, Dir: true},
				{Path: "/etc/egret", Mode: 0o755, Dir: true},
				{Path: "/sys", Mode: 0o555, Dir: true},
				{Path: "/proc", Mode: 0o555, Dir: true},
				{Path: "/dev", Mode: 0o755, Dir: true},
			},
			Entrypoint: []string{"/egret"},
			Labels: map[string]string{
				"org.opencontainers.image.source":  "https://github.com/egret-proxy/egret",
				"org.opencontainers.image.version": version,
			},
		})
	}
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	digest, err := ociimage.WriteIndex(f, name, imgs)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return digest, err
}
