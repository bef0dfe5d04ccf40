package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/proxy/policy"
)

func policyCommand(sock cli.Flag) *cli.Command {
	return &cli.Command{
		Name:      "policy",
		Usage:     "the effective retry policy for a destination, and where each field came from",
		ArgsUsage: "[DEST]",
		Description: "DEST is HOST:PORT, [IPv6]:PORT or a URL (http and https imply ports 80 and\n" +
			"443); without it, the defaults (a destination no entry matches). The policy is\n" +
			"the running agent's (or egret proxy --admin's), with --pod's override laid over\n" +
			"it; or, with --policy, a policy file read here without asking anyone. Each field\n" +
			"says where its value came from: builtin (the embedded defaults), defaults (the\n" +
			"file's defaults block), entry (the matching upstream entry), pod defaults or pod\n" +
			"entry (the pod's override), or destination (a budget named after it).",
		Flags: []cli.Flag{sock, outputFlag,
			&cli.StringFlag{Name: "pod", Usage: "the policy of pod `NAME` (namespace/name, or the name alone): the node's with the pod's override"},
			&cli.StringFlag{Name: "policy", Usage: "evaluate the policy `FILE` here instead of asking a running egret"},
		},
		Action: runPolicy,
	}
}

func runPolicy(c *cli.Context) error {
	if c.NArg() > 1 {
		return usage("policy takes at most one DEST (HOST:PORT or a URL)")
	}
	format, err := outputFormat(c)
	if err != nil {
		return err
	}
	dest := c.Args().First()
	if dest != "" {
		if _, _, err := agent.ParseDest(dest); err != nil {
			return usage("%v", err)
		}
	}
	var v agent.PolicyView
	if file := c.String("policy"); file != "" {
		if c.IsSet("pod") {
			return usage("--pod needs a running agent (a pod's override comes with the pod); drop --policy")
		}
		p, err := policy.Load(file)
		if err != nil {
			return policyFileError(file, err)
		}
		if v, err = agent.EffectivePolicy(p, dest); err != nil {
			return usage("%v", err)
		}
	} else {
		q := url.Values{"dest": {dest}}
		if pod := c.String("pod"); pod != "" {
			q.Set("pod", pod)
		}
		body, err := adminGet(c.String("admin"), "/policy?"+q.Encode())
		if err != nil {
			return err
		}
		if err := json.Unmarshal(body, &v); err != nil {
			return cli.Exit(err.Error(), 1)
		}
	}
	if format == outputJSON {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return writePolicy(c.App.Writer, v)
}

func writePolicy(w io.Writer, v agent.PolicyView) error {
	fmt.Fprintf(w, "Destination: %s\n", dash(v.Dest))
	if v.Pod != "" {
		fmt.Fprintf(w, "Pod:         %s\n", v.Pod)
	}
	fmt.Fprintf(w, "Policy:      %s\nEntry:       %s\n", v.Policy, v.Entry)
	if v.Upstream != "" {
		fmt.Fprintf(w, "Upstream:    %s (its budget and metrics label)\n", v.Upstream)
	}
	rows := [][]string{{"FIELD", "VALUE", "FROM"}}
	for _, f := range v.Fields {
		from := f.From
		if f.File != "" {
			from += " (" + f.File + ":" + strconv.Itoa(f.Line) + ")"
		}
		rows = append(rows, []string{f.Name, fieldValue(f.Value), from})
	}
	return table(w, rows)
}

// fieldValue renders a policy field's value as the policy file writes it.
func fieldValue(v any) string {
	switch v := v.(type) {
	case string:
		if v == "" {
			return `""`
		}
		return v
	case nil:
		return "-"
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case bool, int:
		return fmt.Sprint(v)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
