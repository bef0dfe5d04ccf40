// Package cli wires egret's subcommands (urfave/cli v2). Each subcommand
// lives in its own file and only parses flags and calls into its package.
//
// Its manners are those of go, kubectl and cilium: a usage error is printed
// once, with a one-line hint, and exits 2 (ExitUsage); a failure exits 1
// (ExitFailure); an unknown command or flag names the closest one.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"
)

// App builds the egret command line.
func App() *cli.App {
	cmds := append([]*cli.Command{
		simulateCommand(),
		proxyCommand(),
		agentCommand(), runCommand(),
		keeperCommand(),
		// The agent's admin calls (status, pods, upstreams, explain)
		// stand at the top as well as under `egret agent`.
	}, append(adminCommands(), topCommand(), versionCommand(), completionCommand(), helpCommand())...)
	withManners(cmds, "egret")
	app := &cli.App{
		Name:     "egret",
		HelpName: "egret",
		Usage:    "truthful egress HTTP retries for Kubernetes pods",
		Commands: cmds,
		// --version is egret's own flag (urfave's would also take -v).
		HideVersion: true,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "version", Usage: "print egret's version and exit"},
			// urfave adds --help only when no command is named help:
			// egret's help command is its own (helpCommand), so is this.
			cli.HelpFlag,
		},
		HideHelpCommand: true,
		// --generate-bash-completion: what `egret completion` scripts ask.
		EnableBashCompletion: true,
		Action: func(c *cli.Context) error {
			switch {
			case c.Bool("version"):
				fmt.Fprintln(c.App.Writer, versionLine())
				return nil
			case c.NArg() == 0:
				// As `go` alone: the help, on stderr, and a usage status.
				w := c.App.Writer
				c.App.Writer = c.App.ErrWriter
				_ = cli.ShowAppHelp(c)
				c.App.Writer = w
				return cli.Exit("", ExitUsage)
			}
			return unknownCommand("egret", c.App.Commands, c.Args().First())
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return flagError(nil, "egret", err)
		},
	}
	return app
}

// exitCoder lets a command choose its exit status without printing twice.
type exitCoder interface{ ExitCode() int }

// Main runs egret with args and returns the process exit status.
func Main(args []string) int {
	return run(App(), args, os.Stderr)
}

// run runs app and reports its error, once, on stderr.
func run(app *cli.App, args []string, stderr io.Writer) int {
	app.ErrWriter = stderr
	app.ExitErrHandler = func(*cli.Context, error) {} // run reports errors itself
	err := app.Run(helpArgs(args))
	if err == nil {
		return 0
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "egret: %s\n%s\n", ue.msg, ue.hint())
		return ExitUsage
	}
	var ec exitCoder
	if errors.As(err, &ec) {
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(stderr, "egret:", msg)
		}
		return ec.ExitCode()
	}
	fmt.Fprintln(stderr, "egret:", err)
	return ExitFailure
}

// helpCommand lists `egret help` among the commands. It never runs:
// helpArgs turns `egret help [COMMAND...]` into `egret [COMMAND...] --help`
// before the arguments are parsed.
func helpCommand() *cli.Command {
	return &cli.Command{
		Name:      "help",
		Usage:     "show the help of egret, or of a command (egret help COMMAND is egret COMMAND --help)",
		ArgsUsage: "[COMMAND...]",
		Action: func(c *cli.Context) error {
			return cli.ShowAppHelp(c)
		},
	}
}

// helpArgs makes `egret help [COMMAND...]` what `go help` and `kubectl
// help` are: `egret [COMMAND...] --help`. (urfave's own help command is
// hidden: it would add a help subcommand under every command.)
func helpArgs(args []string) []string {
	if len(args) < 2 || args[1] != "help" {
		return args
	}
	return append(append([]string{args[0]}, args[2:]...), "--help")
}
