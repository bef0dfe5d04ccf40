// Command release makes one release of egret: the image (an OCI image
// index for linux/amd64 and linux/arm64, deploy/image) and the Helm chart
// (deploy/helm/egret, `helm package`), both with one version, the chart
// pointing at the image by that tag.
//
//	go run ./deploy/release -version 0.2.0 -repository registry.example/egret
//
// writes dist/egret-image-0.2.0.tar (registry.example/egret:0.2.0) and
// dist/egret-0.2.0.tgz (version and appVersion 0.2.0, image.repository
// registry.example/egret). Nothing is pushed: push the image with
// `skopeo copy --all oci-archive:dist/egret-image-0.2.0.tar
// docker://registry.example/egret:0.2.0` (or crane, or oras) and the chart
// with `helm push dist/egret-0.2.0.tgz oci://registry.example/charts`.
//
// helm is -helm, or $EGRET_HELM, or the one test/helm builds from the Go
// module proxy and caches (go run ./test/helm/cmd/helmtool).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/egret-proxy/egret/deploy/image/imagebuild"
)

func main() {
	var o Options
	flag.StringVar(&o.Version, "version", "", "the release's version, SemVer without a v (0.2.0, 1.0.0-rc.1): the image's tag, the chart's version and appVersion")
	flag.StringVar(&o.Repository, "repository", DefaultRepository, "the image's repository, as the nodes pull it")
	flag.StringVar(&o.Out, "o", "dist", "the directory to write to")
	flag.StringVar(&o.Helm, "helm", os.Getenv("EGRET_HELM"), "the helm command; empty: the one test/helm builds and caches")
	platforms := flag.String("platforms", strings.Join(imagebuild.DefaultPlatforms, ","), "the image's platforms")
	flag.Parse()
	if flag.NArg() != 0 || o.Version == "" {
		fmt.Fprintln(os.Stderr, "release: usage: go run ./deploy/release -version X [-repository R] [-o DIR]; see -h")
		os.Exit(2)
	}
	o.Platforms = strings.Split(*platforms, ",")
	r, err := Make(o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
	fmt.Printf("image %s (%s)\nchart %s\n", r.Image, r.ImageDigest, r.Chart)
}
