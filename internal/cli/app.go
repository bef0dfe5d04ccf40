// Package cli wires egret's subcommands (urfave/cli v2). Each subcommand
// lives in its own file and only parses flags and calls into its package.
package cli

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

// App builds the egret command line.
func App() *cli.App {
	return &cli.App{
		Name:  "egret",
		Usage: "truthful egress HTTP retries for Kubernetes pods",
		// The agent's admin calls (status, pods, upstreams, explain) stand
		// at the top as well as under `egret agent`.
		Commands: append([]*cli.Command{
			simulateCommand(),
			proxyCommand(),
			agentCommand(), runCommand(),
		}, adminCommands()...),
		HideHelpCommand: true,
	}
}

// exitCoder lets a command choose its exit status without printing twice.
type exitCoder interface{ ExitCode() int }

// Main runs egret with args and returns the process exit status.
func Main(args []string) int {
	app := App()
	app.ExitErrHandler = func(*cli.Context, error) {} // Main reports errors itself
	err := app.Run(args)
	if err == nil {
		return 0
	}
	var ec exitCoder
	if errors.As(err, &ec) {
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(os.Stderr, "egret:", msg)
		}
		return ec.ExitCode()
	}
	fmt.Fprintln(os.Stderr, "egret:", err)
	return 1
}
