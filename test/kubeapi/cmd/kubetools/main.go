// Command kubetools builds the Kubernetes programs the tests run (etcd,
// kube-apiserver, kubelet, kube-controller-manager, kube-scheduler,
// kube-proxy) from test/kubeapi/tools and CoreDNS from test/kubeapi/coredns,
// once per machine, and prints where they are. The
// tests build them on first use anyway; .ci/run calls this first so that a
// cold build (tens of minutes on 2 cores) shows its progress and is not
// counted in a test's timeout.
//
//	go run ./test/kubeapi/cmd/kubetools [NAME...]
package main

import (
	"fmt"
	"os"
	"sort"

	"github.com/egret-proxy/egret/test/kubeapi"
)

func main() {
	paths, err := kubeapi.Build(os.Args[1:]...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubetools:", err)
		os.Exit(1)
	}
	names := make([]string, 0, len(paths))
	for n := range paths {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Printf("%s\t%s\n", n, paths[n])
	}
}
