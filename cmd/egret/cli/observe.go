package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/proxy"
)

// defaultObserveLast is how many past requests observe shows without
// --follow or --last, as hubble observe does.
const defaultObserveLast = 20

func observeCommand(sock cli.Flag) *cli.Command {
	return &cli.Command{
		Name:  "observe",
		Usage: "the requests egret answered: outcome, attempts, pod, upstream and why (--follow: live)",
		Description: "Shows the last requests the agent (or egret proxy --admin) answered, the\n" +
			"newest last; with --follow, then each request as it is answered until interrupted.\n" +
			"The filters combine. An observer that reads too slowly misses requests rather\n" +
			"than slowing them: the stream says how many (\"lost N requests\").",
		Flags: []cli.Flag{sock, outputFlag,
			&cli.StringFlag{Name: "pod", Usage: "only the requests of pod `NAME` (name, or namespace/name)"},
			&cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Usage: "only the requests of pods in `NAMESPACE`"},
			&cli.StringFlag{Name: "upstream", Usage: "only the requests to `UPSTREAM` (as egret upstreams names it)"},
			&cli.StringFlag{Name: "outcome", Usage: "only the requests with `OUTCOME`: " + strings.Join(proxy.Outcomes, ", ")},
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep showing requests as they are answered"},
			&cli.IntFlag{Name: "last", Usage: "show the last `N` requests first (default: 20, or 0 with --follow)"},
		},
		Action: runObserve,
	}
}

func runObserve(c *cli.Context) error {
	if c.NArg() > 0 {
		return usage("observe takes no arguments; filter with --pod, --namespace, --upstream, --outcome")
	}
	format, err := outputFormat(c)
	if err != nil {
		return err
	}
	if o := c.String("outcome"); o != "" && !slices.Contains(proxy.Outcomes, o) {
		return usage("--outcome %q: expected one of %s", o, strings.Join(proxy.Outcomes, ", "))
	}
	follow := c.Bool("follow")
	last := defaultObserveLast
	if follow {
		last = 0
	}
	if c.IsSet("last") {
		last = c.Int("last")
	}
	if last < 0 {
		return usage("--last %d: expected a count, 0 or more", last)
	}
	q := url.Values{}
	for _, k := range []string{"pod", "namespace", "upstream", "outcome"} {
		if v := c.String(k); v != "" {
			q.Set(k, v)
		}
	}
	q.Set("last", strconv.Itoa(last))
	if follow {
		q.Set("follow", "1")
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	sock := c.String("admin")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://egret/observe?"+q.Encode(), nil)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	client := agent.AdminClient(sock)
	client.Timeout = 0 // a stream; ended by the context
	resp, err := client.Do(req)
	if err != nil {
		return adminError(sock, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		var e struct{ Error string }
		_ = json.Unmarshal(body, &e)
		return cli.Exit(strings.TrimSpace(e.Error), 1)
	}
	err = printObserve(c.App.Writer, format, resp.Body)
	if ctx.Err() != nil {
		return nil // interrupted: the normal end of --follow
	}
	return err
}

// observeRowFormat lays out the table's header and each event under it
// (fixed widths: the table is written as the events come).
const observeRowFormat = "%-12s  %-28s  %-24s  %-10s  %3s  %-18s  %6s  %9s  %s %s  %s\n"

func observeHeader(w io.Writer) {
	fmt.Fprintf(w, observeRowFormat, "TIME", "POD", "UPSTREAM", "OUTCOME", "ATT", "REASON", "STATUS", "DURATION", "METHOD", "URL", "ID")
}

func observeRow(w io.Writer, e *proxy.Event) {
	pod := e.Pod
	if e.Namespace != "" {
		pod = e.Namespace + "/" + e.Pod
	}
	status := "-"
	if e.Status != 0 {
		status = strconv.Itoa(e.Status)
	}
	d := time.Duration(e.Duration * float64(time.Second))
	fmt.Fprintf(w, observeRowFormat, e.Time.Local().Format("15:04:05.000"), dash(pod), dash(e.Upstream), e.Outcome,
		strconv.Itoa(e.Attempts), e.Reason, status, roundDuration(d), dash(e.Method), dash(e.URL), e.RequestID)
}

// roundDuration shows d to 3 significant figures or so.
func roundDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// printObserve copies the stream of events to w: as it is (JSON lines) or
// as a table, a lost-events line as a note between rows.
func printObserve(w io.Writer, format string, r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	if format == outputTable {
		observeHeader(bw)
	}
	for sc.Scan() {
		line := sc.Bytes()
		if format == outputJSON {
			bw.Write(line)
			bw.WriteByte('\n')
		} else {
			var lost agent.LostEvents
			if err := json.Unmarshal(line, &lost); err == nil && lost.LostEvents > 0 {
				fmt.Fprintf(bw, "... lost %d requests: this observer fell behind\n", lost.LostEvents)
			} else {
				var e proxy.Event
				if err := json.Unmarshal(line, &e); err != nil {
					return cli.Exit(fmt.Sprintf("observe: %v", err), 1)
				}
				observeRow(bw, &e)
			}
		}
		if err := bw.Flush(); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return cli.Exit(fmt.Sprintf("observe: %v", err), 1)
	}
	return nil
}
