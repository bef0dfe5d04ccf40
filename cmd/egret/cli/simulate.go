package cli

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/engine/simulate"
)

func simulateCommand() *cli.Command {
	return &cli.Command{
		Name:      "simulate",
		Usage:     "answer retry decisions for JSON lines (stdin or FILE)",
		ArgsUsage: "[FILE]",
		Description: "Each input line is a JSON object as in the spec's section 7; each answer is\n" +
			`{"decision", "reason", "delay_ms"} or {"error"}. Exits 1 if any line was invalid.`,
		Flags: []cli.Flag{
			&cli.Uint64Flag{Name: "seed", Usage: "seed the jitter for reproducible delays (0: random)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return usage("simulate takes at most one FILE")
			}
			var in io.Reader = os.Stdin
			if c.NArg() == 1 && c.Args().First() != "-" {
				f, err := os.Open(c.Args().First())
				if err != nil {
					return cli.Exit(err.Error(), 2)
				}
				defer f.Close()
				in = f
			}
			var rnd engine.Rand = engine.DefaultRand
			if s := c.Uint64("seed"); s != 0 {
				rnd = rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
			}
			err := simulate.Run(in, c.App.Writer, rnd)
			if errors.Is(err, simulate.ErrBadLines) {
				return cli.Exit("", 1)
			}
			if err != nil {
				return cli.Exit(fmt.Sprintf("simulate: %v", err), 1)
			}
			return nil
		},
	}
}
