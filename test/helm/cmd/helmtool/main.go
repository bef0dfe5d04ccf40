// Command helmtool builds the helm command deploy's tests run (from
// test/helm/tools, once per machine) and prints its path. The tests build
// it on first use anyway; .ci/run calls this first so that a cold build
// shows its progress and is not counted in a test's timeout.
//
//	go run ./test/helm/cmd/helmtool
package main

import (
	"fmt"
	"os"

	"github.com/egret-proxy/egret/test/helm"
)

func main() {
	p, err := helm.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "helmtool:", err)
		os.Exit(1)
	}
	fmt.Println(p)
}
