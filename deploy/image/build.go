package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/egret-proxy/egret/internal/ociimage"
)

// versionVar is the variable -ldflags -X stamps egret's version into
// (cmd/egret/cli.Version, printed by `egret --version`).
const versionVar = "github.com/egret-proxy/egret/cmd/egret/cli.Version"

// tagOf returns the tag of an image reference: "0.1.0" of
// "ghcr.io/egret-proxy/egret:0.1.0". A reference without a tag (a colon in
// the registry's host:port is not one) or with a digest is an error.
func tagOf(name string) (string, error) {
	if strings.Contains(name, "@") {
		return "", fmt.Errorf("-name %q: a digest cannot name an image being built; give name:tag", name)
	}
	i := strings.LastIndex(name, ":")
	if i < 0 || i < strings.LastIndex(name, "/") || i == len(name)-1 {
		return "", fmt.Errorf("-name %q has no tag; give name:tag", name)
	}
	return name[i+1:], nil
}

// buildBinary builds cmd/egret as a static binary at out (the working
// directory must be in egret's module), with version stamped in.
func buildBinary(out, version string) error {
	if version == "" || strings.ContainsAny(version, " \t\n'\"") {
		return errors.New("the version must be one word")
	}
	cmd := exec.Command("go", "build", "-trimpath",
		"-ldflags", "-s -w -X "+versionVar+"="+version,
		"-o", out, "github.com/egret-proxy/egret/cmd/egret")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v: %s", err, b)
	}
	return nil
}

// writeImage writes the image archive of the egret binary bin to out,
// labelled with version.
func writeImage(out, name, version, bin string) (string, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	digest, err := ociimage.Write(f, ociimage.Image{
		Name: name,
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
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return digest, err
}
