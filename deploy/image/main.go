// Command image builds egret's container image without a registry, a
// daemon or a base image: the static egret binary (cgo off, the eBPF
// objects are committed under bpf/) as /egret in a single-layer OCI image
// layout archive, importable on a node with
//
//	go run ./deploy/image -o egret.tar
//	ctr -n k8s.io images import egret.tar
//
// The image is named as deploy/kubernetes runs it
// (ghcr.io/egret-proxy/egret:0.1.0; -name for another), so a node that
// imported it needs no pull (imagePullPolicy IfNotPresent). With a
// registry, deploy/Containerfile builds the same binary on distroless.
//
// The version (-version, by default the tag of -name) is stamped into the
// binary, which `/egret --version` prints, and labels the image
// (org.opencontainers.image.version).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

// DefaultName is the image deploy/kubernetes/daemonset.yaml runs.
const DefaultName = "ghcr.io/egret-proxy/egret:0.1.0"

func main() {
	out := flag.String("o", "egret-image.tar", "the archive to write")
	name := flag.String("name", DefaultName, "the image's name:tag")
	version := flag.String("version", "", "the version stamped into the binary (egret --version); empty: the tag")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "image: no arguments expected; see -h")
		os.Exit(2)
	}
	if err := build(*out, *name, *version); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func build(out, name, version string) error {
	if version == "" {
		var err error
		if version, err = tagOf(name); err != nil {
			return err
		}
	}
	tmp, err := os.MkdirTemp("", "egret-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "egret")
	if err := buildBinary(bin, version); err != nil {
		return err
	}
	digest, err := writeImage(out, name, version, bin)
	if err != nil {
		return err
	}
	fmt.Printf("%s: %s %s\n", out, name, digest)
	return nil
}
