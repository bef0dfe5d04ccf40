// Command kubectl-egret is egret's kubectl plugin: on PATH, `kubectl egret
// COMMAND` runs `egret COMMAND` in the egret agent of a pod's node
// (`kubectl egret explain -n NAMESPACE POD REQUEST-ID`,
// `kubectl egret --node NODE top`).
package main

import (
	"os"

	"github.com/egret-proxy/egret/cmd/egret/cli"
)

func main() { os.Exit(cli.KubectlMain(os.Args)) }
