package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/agent"
)

// adminCommands ask a running agent, over its admin socket.
func adminCommands() []*cli.Command {
	sock := &cli.StringFlag{Name: "admin", Value: agent.DefaultAdminSocket, Usage: "the agent's admin `SOCKET`"}
	get := func(name, usage, path string) *cli.Command {
		return &cli.Command{
			Name:  name,
			Usage: usage,
			Flags: []cli.Flag{sock},
			Action: func(c *cli.Context) error {
				if c.NArg() > 0 {
					return cli.Exit(name+" takes no arguments", 2)
				}
				body, err := adminGet(c.String("admin"), path)
				if err != nil {
					return err
				}
				_, err = c.App.Writer.Write(body)
				return err
			},
		}
	}
	return []*cli.Command{
		get("status", "the agent's summary (JSON)", "/status"),
		get("pods", "the pods and their state (JSON)", "/pods"),
		get("upstreams", "the node-wide retry budget of each upstream (JSON)", "/upstreams"),
		{
			Name:      "explain",
			Usage:     "what egret did with one request, by its Egret-Request-Id",
			ArgsUsage: "REQUEST-ID",
			Flags:     []cli.Flag{sock, &cli.BoolFlag{Name: "json", Usage: "print the trace as JSON"}},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return cli.Exit("explain needs one REQUEST-ID", 2)
				}
				body, err := adminGet(c.String("admin"), "/explain/"+c.Args().First())
				if err != nil {
					return err
				}
				if c.Bool("json") {
					_, err = c.App.Writer.Write(body)
					return err
				}
				var tv agent.TraceView
				if err := json.Unmarshal(body, &tv); err != nil {
					return cli.Exit(err.Error(), 1)
				}
				writeExplain(c.App.Writer, tv)
				return nil
			},
		},
	}
}

func adminGet(sock, path string) ([]byte, error) {
	resp, err := agent.AdminClient(sock).Get("http://egret" + path)
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("agent admin socket %s: %v (is egret agent running?)", sock, err), 1)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, cli.Exit(err.Error(), 1)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		_ = json.Unmarshal(body, &e)
		return nil, cli.Exit(strings.TrimSpace(e.Error), 1)
	}
	return body, nil
}

func writeExplain(w io.Writer, tv agent.TraceView) {
	fmt.Fprintf(w, "request %s: %s %s to %s (idempotent %v, body %s) -> outcome %s after %d attempt(s)\n",
		tv.RequestID, tv.Method, tv.URL, tv.Upstream, tv.Idempotent, tv.Body, outcomeOr(tv.Outcome), len(tv.Attempts))
	for _, a := range tv.Attempts {
		what := fmt.Sprintf("status %d", a.Status)
		if a.Status == 0 {
			what = fmt.Sprintf("%s at %s", a.Failure, a.Stage)
		}
		fmt.Fprintf(w, "  attempt %d: %s in %.1f ms; evidence %s", a.N, what, a.DurationMs, a.Evidence)
		if a.Upgraded {
			fmt.Fprint(w, " (upgraded by the witness)")
		}
		fmt.Fprintf(w, "; decision %s/%s; budget %.1f\n", a.Decision, a.Reason, a.Budget)
		if src := a.WitnessAfter.Source; src != "" {
			fmt.Fprintf(w, "    witness (%s): bytes sent %d -> %d, data segments %d -> %d, acked %d, retransmits %d, reset %v\n",
				src, a.WitnessBefore.BytesSent, a.WitnessAfter.BytesSent, a.WitnessBefore.DataSegsOut,
				a.WitnessAfter.DataSegsOut, a.WitnessAfter.BytesAcked, a.WitnessAfter.Retransmits, a.WitnessAfter.ResetReceived)
		}
		if a.Err != "" {
			fmt.Fprintf(w, "    error: %s\n", a.Err)
		}
	}
}

func outcomeOr(o string) string {
	if o == "" {
		return "relayed"
	}
	return o
}
