package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"

	"github.com/egret-proxy/egret/deploy/image/imagebuild"
	"github.com/egret-proxy/egret/test/helm"
)

// DefaultRepository is the repository the chart and the manifests name.
const DefaultRepository = "ghcr.io/egret-proxy/egret"

// Options say what Make makes.
type Options struct {
	Version    string
	Repository string
	Out        string
	Helm       string
	Platforms  []string
}

// Release is what Make wrote.
type Release struct {
	Image       string // the archive's path
	ImageDigest string // the image index's digest
	Chart       string // the chart package's path
}

// semver is SemVer 2 as helm takes a chart's version (no leading v).
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

// repository is an image reference without a tag or digest.
var repository = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$`)

// Make builds the image and packages the chart into o.Out.
func Make(o Options, log io.Writer) (Release, error) {
	var r Release
	switch {
	case !semver.MatchString(o.Version):
		return r, fmt.Errorf("-version %q: want SemVer without a v, such as 0.2.0 or 1.0.0-rc.1 (helm takes no other chart version)", o.Version)
	case !repository.MatchString(o.Repository):
		return r, fmt.Errorf("-repository %q: want a repository without a tag, such as registry.example/egret", o.Repository)
	}
	helmBin := o.Helm
	if helmBin == "" {
		var err error
		if helmBin, err = helm.Build(); err != nil {
			return r, fmt.Errorf("helm: %w", err)
		}
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return r, err
	}
	root, err := moduleRoot()
	if err != nil {
		return r, err
	}

	r.Image = filepath.Join(o.Out, "egret-image-"+o.Version+".tar")
	if r.ImageDigest, err = imagebuild.Build(r.Image, o.Repository+":"+o.Version, o.Version, o.Platforms, log); err != nil {
		return r, err
	}

	// The chart as it is but for the image's repository (the tag is the
	// appVersion, set by helm package).
	tmp, err := os.MkdirTemp("", "egret-chart-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(tmp)
	chart := filepath.Join(tmp, "egret")
	if err := os.CopyFS(chart, os.DirFS(filepath.Join(root, "deploy/helm/egret"))); err != nil {
		return r, err
	}
	values := filepath.Join(chart, "values.yaml")
	b, err := os.ReadFile(values)
	if err != nil {
		return r, err
	}
	line := []byte("\n  repository: " + DefaultRepository + "\n")
	if bytes.Count(b, line) != 1 {
		return r, errors.New("deploy/helm/egret/values.yaml: no single line `  repository: " + DefaultRepository + "` to set")
	}
	b = bytes.Replace(b, line, []byte("\n  repository: "+o.Repository+"\n"), 1)
	if err := os.WriteFile(values, b, 0o644); err != nil {
		return r, err
	}
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return r, err
	}
	cmd := exec.Command(helmBin, "package", chart, "--version", o.Version, "--app-version", o.Version, "-d", out)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(tmp, "cache"), "HELM_CONFIG_HOME="+filepath.Join(tmp, "config"), "HELM_DATA_HOME="+filepath.Join(tmp, "data"))
	if b, err := cmd.CombinedOutput(); err != nil {
		return r, fmt.Errorf("helm package: %v: %s", err, b)
	} else {
		log.Write(b)
	}
	r.Chart = filepath.Join(o.Out, "egret-"+o.Version+".tgz")
	if _, err := os.Stat(r.Chart); err != nil {
		return r, fmt.Errorf("helm package wrote no %s: %w", r.Chart, err)
	}
	return r, nil
}

// moduleRoot is the directory of the module the working directory is in
// (egret's: go build below builds its cmd/egret).
func moduleRoot() (string, error) {
	b, err := exec.Command("go", "env", "GOMOD").Output()
	mod := string(bytes.TrimSpace(b))
	if err != nil || mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("run from egret's module (go env GOMOD: %q, %v)", mod, err)
	}
	return filepath.Dir(mod), nil
}
