// Command egret is the node agent, the proxy and their tools in one binary.
package main

import (
	"os"

	"github.com/egret-proxy/egret/cmd/egret/cli"
)

func main() { os.Exit(cli.Main(os.Args)) }
