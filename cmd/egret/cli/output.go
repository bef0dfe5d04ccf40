package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent"
)

// Output formats of the query commands (-o), as kubectl and cilium name
// them.
const (
	outputTable = "table"
	outputJSON  = "json"
)

// outputFlag is -o on every query command: a table for a person at a
// terminal, JSON (stable snake_case keys) for a program or a pipe.
var outputFlag = &cli.StringFlag{Name: "output", Aliases: []string{"o"},
	Usage: "`FORMAT`: table or json (default: table when stdout is a terminal, else json)"}

// outputFormat is -o, or the default for c's writer.
func outputFormat(c *cli.Context) (string, error) {
	switch o := c.String("output"); o {
	case outputTable, outputJSON:
		return o, nil
	case "":
		if isTerminal(c.App.Writer) {
			return outputTable, nil
		}
		return outputJSON, nil
	default:
		return "", usage("-o %q: expected table or json", o)
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// table writes rows aligned in columns, the first row a header.
func table(w io.Writer, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// printQuery prints the answer of a query command (status, pods,
// upstreams) in the format -o asks for.
func printQuery(c *cli.Context, name string, body []byte) error {
	format, err := outputFormat(c)
	if err != nil {
		return err
	}
	w := c.App.Writer
	switch name {
	case "status":
		return printStatus(c, format, body)
	case "pods":
		if format == outputJSON {
			_, err := w.Write(body)
			return err
		}
		var ps []agent.PodStatus
		if err := json.Unmarshal(body, &ps); err != nil {
			return cli.Exit(err.Error(), 1)
		}
		rows := [][]string{{"NAME", "STATE", "LISTEN", "POLICY", "SINCE", "ERROR"}}
		for _, p := range ps {
			rows = append(rows, []string{p.Name, p.State, dash(strings.Join(p.Listen, ",")), dash(p.Policy),
				since(p.Since), dash(p.Error)})
		}
		return table(w, rows)
	case "upstreams":
		if format == outputJSON {
			_, err := w.Write(body)
			return err
		}
		var us []agent.UpstreamStatus
		if err := json.Unmarshal(body, &us); err != nil {
			return cli.Exit(err.Error(), 1)
		}
		return writeUpstreams(w, us)
	}
	_, err = w.Write(body)
	return err
}

// writeUpstreams writes egret upstreams' table: each budget in use, as
// egret top's BUDGET column shows it.
func writeUpstreams(w io.Writer, us []agent.UpstreamStatus) error {
	rows := [][]string{{"UPSTREAM", "TOKENS"}}
	for _, u := range us {
		rows = append(rows, []string{u.Upstream, budgetCell(&u.Tokens)})
	}
	if err := table(w, rows); err != nil {
		return err
	}
	if len(us) == 0 {
		_, err := fmt.Fprintln(w, "("+budgetNone+")")
		return err
	}
	return nil
}

// printStatus prints the summary with the version, kernel and eBPF
// features of the egret that answers (GET /about): as one JSON object, the
// summary's keys and version, go, kernel and ebpf.
func printStatus(c *cli.Context, format string, body []byte) error {
	st := map[string]any{}
	if err := json.Unmarshal(body, &st); err != nil {
		return cli.Exit(err.Error(), 1)
	}
	ab, err := adminGet(c.String("admin"), "/about")
	if err != nil {
		return err
	}
	var about agent.About
	if err := json.Unmarshal(ab, &about); err != nil {
		return cli.Exit(err.Error(), 1)
	}
	st["version"], st["go"], st["kernel"], st["ebpf"] = about.Version, about.Go, about.Kernel, about.EBPF
	w := c.App.Writer
	if format == outputJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	fmt.Fprintf(w, "Version:  %s (%s)\nKernel:   %s\n", about.Version, about.Go, about.Kernel)
	keys := make([]string, 0, len(st))
	for k := range st {
		switch k {
		case "version", "go", "kernel", "ebpf":
		default:
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	rows := [][]string{}
	for _, k := range keys {
		if k == "direct" {
			rows = append(rows, []string{k + ":", directLine(st[k])})
			continue
		}
		rows = append(rows, []string{k + ":", scalar(st[k])})
	}
	if err := table(w, rows); err != nil {
		return err
	}
	if about.EBPF == nil {
		return nil
	}
	fmt.Fprintln(w, "eBPF features:")
	rows = [][]string{{"  FEATURE", "SINCE", "AVAILABLE", "USE"}}
	for _, f := range about.EBPF {
		avail := "yes"
		if !f.Available {
			avail = "no: " + f.Error
		}
		rows = append(rows, []string{"  " + f.Name, f.Since, avail, f.Use})
	}
	return table(w, rows)
}

// scalar renders a decoded JSON value on one line.
func scalar(v any) string {
	switch v := v.(type) {
	case nil:
		return "-"
	case string:
		return dash(v)
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case bool:
		return fmt.Sprint(v)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// directLine is the status's direct totals (agent.DirectTotals, as JSON):
// the connects egret did not retry (left direct or passed through) and how many of their failures a retry
// could have fixed safely.
func directLine(v any) string {
	m, _ := v.(map[string]any)
	c, _ := m["connects"].(float64)
	s, _ := m["safe_to_retry"].(float64)
	a, _ := m["ambiguous"].(float64)
	return fmt.Sprintf("%.0f connects not retried (direct or passed through); failures: %.0f a retry could have fixed safely, %.0f ambiguous (egret top)", c, s, a)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// since is how long ago t was, to the second.
func since(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String()
}
