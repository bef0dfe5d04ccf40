// Command image builds egret's container image without a registry, a
// daemon, a base image or an emulator: the static egret binary,
// cross-compiled for each platform (CGO_ENABLED=0 GOARCH=amd64 and arm64;
// the eBPF objects are committed under bpf/), as /egret in a one-layer
// image per platform, the platforms under one OCI image index, written
// as an OCI image layout archive:
//
//	go run ./deploy/image -o egret.tar                        # linux/amd64 and linux/arm64
//	ctr -n k8s.io images import --all-platforms egret.tar     # on a node, without a registry
//	skopeo copy --all oci-archive:egret.tar docker://registry.example/egret:0.1.0   # to a registry
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
	"strings"

	"github.com/egret-proxy/egret/deploy/image/imagebuild"
)

func main() {
	out := flag.String("o", "egret-image.tar", "the archive to write")
	name := flag.String("name", imagebuild.DefaultName, "the image's name:tag")
	version := flag.String("version", "", "the version stamped into the binary (egret --version); empty: the tag")
	platforms := flag.String("platforms", strings.Join(imagebuild.DefaultPlatforms, ","), "the platforms of the image index, comma-separated")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "image: no arguments expected; see -h")
		os.Exit(2)
	}
	if _, err := imagebuild.Build(*out, *name, *version, strings.Split(*platforms, ","), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}
