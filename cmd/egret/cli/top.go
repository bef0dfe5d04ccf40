package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/agent"
)

// topSorts are the columns `egret top --sort` takes: rates, highest
// first; budget, least left first; name, in order.
var topSorts = []string{"requests", "retries", "ambiguous", "not-sent", "failed", "budget", "name"}

func topCommand() *cli.Command {
	return &cli.Command{
		Name:  "top",
		Usage: "live per-pod and per-upstream rates: requests, retries, ambiguous, not-sent, failed, budget left",
		Description: "Asks the agent (or egret proxy --admin) for its summary (GET /summary on the admin\n" +
			"socket) every --interval and redraws the tables in place on a terminal; elsewhere\n" +
			"each refresh is printed after the last. Rates are per second over the agent's last\n" +
			"10 s; counts are since each series began. --once prints one table (or -o json) and exits.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "admin", Value: agent.DefaultAdminSocket, Usage: "the admin `SOCKET` of the agent, or of egret proxy --admin"},
			&cli.StringFlag{Name: "sort", Value: "requests", Usage: "sort rows by `FIELD`: " + strings.Join(topSorts, ", ") + " (rates highest first; budget least left first)"},
			&cli.BoolFlag{Name: "once", Usage: "print one table and exit"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table, or json (with --once: the summary as the admin API gives it)"},
			&cli.DurationFlag{Name: "interval", Value: time.Second, Usage: "time between refreshes"},
		},
		Action: runTop,
	}
}

func runTop(c *cli.Context) error {
	if c.NArg() > 0 {
		return usage("top takes no arguments")
	}
	by := c.String("sort")
	if !contains(topSorts, by) {
		return usage("--sort %s: expected one of %s", by, strings.Join(topSorts, ", "))
	}
	out := c.String("output")
	switch {
	case out != "table" && out != "json":
		return usage("-o %s: expected table or json", out)
	case out == "json" && !c.Bool("once"):
		return usage("-o json needs --once (a live view is a table)")
	case c.Duration("interval") <= 0:
		return usage("--interval %s: expected a positive duration, such as 1s", c.Duration("interval"))
	}
	sock := c.String("admin")
	w := c.App.Writer
	if c.Bool("once") {
		body, err := adminGet(sock, "/summary")
		if err != nil {
			return err
		}
		if out == "json" {
			_, err = w.Write(body)
			return err
		}
		s, err := decodeSummary(body)
		if err != nil {
			return err
		}
		return writeTop(w, s, by, sock)
	}

	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tty := isTerminal(w)
	tick := time.NewTicker(c.Duration("interval"))
	defer tick.Stop()
	var last *agent.Summary
	for first := true; ; first = false {
		body, err := adminGet(sock, "/summary")
		var s agent.Summary
		if err == nil {
			s, err = decodeSummary(body)
		}
		if err != nil && first {
			return err
		}
		var buf bytes.Buffer
		if tty {
			buf.WriteString("\x1b[H\x1b[2J") // home, clear: redraw in place
		} else if !first {
			buf.WriteString("\n")
		}
		if err != nil {
			// Keep the last tables, say why they are not fresh.
			fmt.Fprintf(&buf, "egret top: %v (retrying every %s)\n", err, c.Duration("interval"))
			if last != nil {
				_ = writeTop(&buf, *last, by, sock)
			}
		} else {
			last = &s
			_ = writeTop(&buf, s, by, sock)
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func decodeSummary(body []byte) (agent.Summary, error) {
	var s agent.Summary
	if err := json.Unmarshal(body, &s); err != nil {
		return s, cli.Exit(fmt.Sprintf("summary: %v", err), 1)
	}
	return s, nil
}

// rateOf is the rate a --sort field names.
func rateOf(r agent.Rates, by string) float64 {
	switch by {
	case "retries":
		return r.Retries
	case "ambiguous":
		return r.Ambiguous
	case "not-sent":
		return r.NotSent
	case "failed":
		return r.Failed
	}
	return r.Requests
}

// writeTop writes s's pod and upstream tables, sorted by by.
func writeTop(w io.Writer, s agent.Summary, by, sock string) error {
	pods, ups := append([]agent.PodSummary(nil), s.Pods...), append([]agent.UpstreamSummary(nil), s.Upstreams...)
	sort.SliceStable(pods, func(i, j int) bool {
		a, b := pods[i], pods[j]
		if by != "name" && by != "budget" {
			if x, y := rateOf(a.Rates, by), rateOf(b.Rates, by); x != y {
				return x > y
			}
		}
		return a.Namespace+"/"+a.Pod < b.Namespace+"/"+b.Pod
	})
	sort.SliceStable(ups, func(i, j int) bool {
		a, b := ups[i], ups[j]
		switch by {
		case "name":
		case "budget":
			x, y := budgetOr(a.BudgetTokens), budgetOr(b.BudgetTokens)
			if x != y {
				return x < y
			}
		default:
			if x, y := rateOf(a.Rates, by), rateOf(b.Rates, by); x != y {
				return x > y
			}
		}
		return a.Upstream < b.Upstream
	})
	flows := append([]agent.FlowSummary(nil), s.Flows...)
	sort.SliceStable(flows, func(i, j int) bool {
		a, b := flows[i], flows[j]
		if by != "name" && by != "budget" {
			if x, y := rateOf(a.Rates, by), rateOf(b.Rates, by); x != y {
				return x > y
			}
		}
		return a.Namespace+"/"+a.Pod+" "+a.Upstream < b.Namespace+"/"+b.Pod+" "+b.Upstream
	})
	window := "rates need two samples a second apart"
	if s.WindowSeconds > 0 {
		window = fmt.Sprintf("rates /s over %.1fs", s.WindowSeconds)
	}
	fmt.Fprintf(w, "egret top  %s  %d pods, %d upstreams, %s, sorted by %s  %s\n\n",
		sock, len(pods), len(ups), window, by, s.Time.Local().Format("15:04:05"))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(pods) > 0 {
		fmt.Fprintln(tw, "POD\tWORKLOAD\tREQ/S\tRETRY/S\tAMBIG/S\tNOTSENT/S\tFAILED/S\tREQUESTS\tRETRIES\tAMBIGUOUS\tNOT-SENT")
		for _, p := range pods {
			name := p.Pod
			if p.Namespace != "" {
				name = p.Namespace + "/" + p.Pod
			}
			fmt.Fprintf(tw, "%s\t%s\t%s%d\t%d\t%d\t%d\n", name, orDash(p.Workload), rateCols(p.Rates),
				p.Counts.Requests, p.Counts.Retries, p.Counts.Ambiguous, p.Counts.NotSent)
		}
		fmt.Fprintln(tw)
	}
	if len(flows) > 0 {
		fmt.Fprintln(tw, "POD\tUPSTREAM\tREQ/S\tRETRY/S\tAMBIG/S\tNOTSENT/S\tFAILED/S\tREQUESTS\tRETRIES\tAMBIGUOUS\tNOT-SENT")
		for _, f := range flows {
			fmt.Fprintf(tw, "%s/%s\t%s\t%s%d\t%d\t%d\t%d\n", f.Namespace, f.Pod, f.Upstream, rateCols(f.Rates),
				f.Counts.Requests, f.Counts.Retries, f.Counts.Ambiguous, f.Counts.NotSent)
		}
		fmt.Fprintln(tw)
	}
	if len(s.Direct) > 0 {
		// What egret does not retry: connects left direct, as the kernel
		// saw them end, and connections passed through (PATH
		// passthrough/<protocol>), as egret's upstream socket saw them.
		var safe uint64
		fmt.Fprintln(tw, "POD\tNOT RETRIED: PATH\tDESTINATION\tCONNECTS\tESTABLISHED\tREFUSED\tTIMED-OUT\tUNREACHABLE\tRST-BEFORE-ACK\tRST-AFTER-ACK\tRETRANS\tSAFE-TO-RETRY")
		for _, d := range s.Direct {
			name := d.Pod
			if d.Namespace != "" {
				name = d.Namespace + "/" + d.Pod
			}
			path := d.Path
			if d.Protocol != "" {
				path = d.Path + "/" + d.Protocol
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", name, path, dash(d.Destination), d.Connects, d.Established,
				d.Refused, d.TimedOut, d.Unreachable, d.ResetBeforeAck, d.ResetAfterAck, d.Retransmits, d.SafeToRetry)
			safe += d.SafeToRetry
		}
		fmt.Fprintf(tw, "(not retried by egret: %d failures a retry could have fixed safely, the connect never completed; a reset, before or after an ack, is ambiguous)\n\n", safe)
	}
	fmt.Fprintln(tw, "UPSTREAM\tREQ/S\tRETRY/S\tAMBIG/S\tNOTSENT/S\tFAILED/S\tREQUESTS\tRETRIES\tAMBIGUOUS\tNOT-SENT\tBUDGET")
	idle := false
	for _, u := range ups {
		idle = idle || u.BudgetTokens == nil
		fmt.Fprintf(tw, "%s\t%s%d\t%d\t%d\t%d\t%s\n", u.Upstream, rateCols(u.Rates),
			u.Counts.Requests, u.Counts.Retries, u.Counts.Ambiguous, u.Counts.NotSent, budgetCell(u.BudgetTokens))
	}
	if len(ups) == 0 {
		fmt.Fprintln(tw, "(no requests yet)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if idle {
		_, err := fmt.Fprintln(w, "\nBUDGET -: "+budgetNone)
		return err
	}
	return nil
}

// budgetNone says what a budget shown as "-" is, in egret top and egret
// upstreams alike.
const budgetNone = "no budget in use (idle past its TTL, forgotten: the next request starts a fresh one at its floor; or \"other\", many upstreams)"

// budgetCell is a budget as egret top and egret upstreams show it: the
// retries it allows now, one decimal, or "-" when none is in use.
func budgetCell(tokens *float64) string {
	if tokens == nil {
		return "-"
	}
	return strconv.FormatFloat(*tokens, 'f', 1, 64)
}

func rateCols(r agent.Rates) string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
	return f(r.Requests) + "\t" + f(r.Retries) + "\t" + f(r.Ambiguous) + "\t" + f(r.NotSent) + "\t" + f(r.Failed) + "\t"
}

func budgetOr(b *float64) float64 {
	if b == nil {
		return 1e308 // none in use: last
	}
	return *b
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
