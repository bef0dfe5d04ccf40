package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/egret-proxy/egret/internal/ociimage"
)

// buildBinary builds cmd/egret as a static binary at out (the working
// directory must be in egret's module).
func buildBinary(out, name, version string) error {
	if version == "" {
		version = name[strings.LastIndex(name, ":")+1:]
	}
	cmd := exec.Command("go", "build", "-trimpath",
		"-ldflags", "-s -w -X github.com/egret-proxy/egret/internal/version.Version="+version,
		"-o", out, "github.com/egret-proxy/egret/cmd/egret")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v: %s", err, b)
	}
	return nil
}

// writeImage writes the image archive of the egret binary bin to out.
func writeImage(out, name, bin string) (string, error) {
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
		Labels:     map[string]string{"org.opencontainers.image.source": "https://github.com/egret-proxy/egret"},
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return digest, err
}
