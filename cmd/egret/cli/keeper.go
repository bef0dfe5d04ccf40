package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/agent/keeper"
)

// DefaultKeeperSocket is where `egret keeper` listens unless told.
const DefaultKeeperSocket = "/run/egret/keeper.sock"

func keeperCommand() *cli.Command {
	return &cli.Command{
		Name:  "keeper",
		Usage: "hold the agent's pod listeners while the agent restarts, so that connects queued on them survive a kill",
		Description: "Run beside `egret agent --keeper SOCKET` (in the DaemonSet, a second container of\n" +
			"the agent's pod sharing SOCKET's directory). The agent hands the keeper a duplicate\n" +
			"of each pod's listener (SCM_RIGHTS; only a peer of the keeper's own uid is served).\n" +
			"If the agent dies, even by SIGKILL, the listeners stay open in the keeper: connects\n" +
			"the kernel had queued on them stay queued, and the next agent gets the listeners\n" +
			"back, adopts them and serves those connects. New connects go direct meanwhile.\n" +
			"If no agent comes within --hold, the keeper closes the listeners: the connects\n" +
			"queued on them are reset at once rather than left waiting on a restart the kubelet\n" +
			"may delay by minutes (crash-loop back-off); the next agent makes new listeners.\n" +
			"The keeper needs no privileges. On SIGTERM or SIGINT it closes what it holds and exits.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Value: DefaultKeeperSocket, Usage: "unix `SOCKET` the agent connects to"},
			&cli.StringFlag{Name: "hold", Value: keeper.DefaultHold.String(), Usage: "how long a dead agent's listeners are kept for the next agent (`DURATION`, e.g. 3s; 0 keeps them until it comes)"},
			logFormatFlag,
			logLevelFlag,
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usage("keeper takes no arguments")
			}
			log, err := newLogger(c, c.App.ErrWriter)
			if err != nil {
				return err
			}
			hold, err := time.ParseDuration(c.String("hold"))
			if err != nil || hold < 0 {
				return usage("--hold %q: want a duration of 0 or more with its unit, e.g. 3s", c.String("hold"))
			}
			k, err := keeper.Listen(c.String("socket"), log)
			if err != nil {
				return cli.Exit(err.Error(), 1)
			}
			k.Hold = hold
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			log.Info("egret keeper running", "socket", k.Path(), "hold", hold, "pid", os.Getpid())
			if err := k.Serve(ctx); err != nil {
				return cli.Exit(err.Error(), 1)
			}
			log.Info("egret keeper stopped: listeners closed")
			return nil
		},
	}
}

// dialKeeper connects to --keeper (waiting a while for it to start):
// nil, nil without the flag.
func dialKeeper(c *cli.Context, log *slog.Logger) (*keeper.Client, map[string]*os.File, error) {
	sock := c.String("keeper")
	if sock == "" {
		return nil, nil, nil
	}
	kc, kept, err := keeper.DialWait(sock, 30*time.Second)
	if err != nil {
		return nil, nil, cli.Exit(fmt.Sprintf("--keeper %s: %v", sock, err), 1)
	}
	log.Info("egret keeper connected", "socket", sock, "listeners_kept", len(kept))
	return kc, kept, nil
}
