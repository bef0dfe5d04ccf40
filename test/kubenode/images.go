package kubenode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/egret-proxy/egret/internal/ociimage"
)

// ToolsImage is the image of testbin (test/kubenode/testbin): run it as
// `/testbin get URL …`, `/testbin loop …`.
const ToolsImage = "egret.test/tools:1"

// moduleRoot is egret's repository top (two up from this file).
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// importTestImages builds testbin (static) and imports it as the pause
// image and as ToolsImage.
func (n *Node) importTestImages(t testing.TB) error {
	bin := filepath.Join(n.Dir, "images", "testbin")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./test/kubenode/testbin")
	cmd.Dir = moduleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build testbin: %v: %s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	for _, img := range []ociimage.Image{
		{Name: PauseImage, Entrypoint: []string{"/testbin", "pause"}},
		{Name: ToolsImage, Entrypoint: []string{"/testbin"}},
	} {
		img.Files = []ociimage.File{{Path: "/testbin", Mode: 0o755, Data: data}, {Path: "/tmp", Mode: 0o1777, Dir: true}}
		path := filepath.Join(n.Dir, "images", filepath.Base(img.Name)+".tar")
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		_, err = ociimage.Write(f, img)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if err := n.ImportImage(path); err != nil {
			return err
		}
	}
	return nil
}

// ImportEgret builds egret's image with the project's own script
// (go run ./deploy/image) under name and imports it into the node.
func (n *Node) ImportEgret(t testing.TB, name string) {
	t.Helper()
	path := filepath.Join(n.Dir, "images", RandName("egret-")+".tar")
	// The node's platform alone: the other would cost a cross-compile.
	cmd := exec.Command("go", "run", "./deploy/image", "-o", path, "-name", name, "-platforms", "linux/"+runtime.GOARCH)
	cmd.Dir = moduleRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./deploy/image: %v: %s", err, out)
	}
	if err := n.ImportImage(path); err != nil {
		t.Fatalf("kubenode: import %s: %v", name, err)
	}
	_ = os.Remove(path)
}
