package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"

	"github.com/urfave/cli/v2"
)

// Exit statuses, as `go`, `kubectl` and most Unix tools use them (the
// README lists them for users).
const (
	// ExitFailure: egret could not do its job (kernel, sockets, an agent
	// that does not answer, input lines `simulate` refused).
	ExitFailure = 1
	// ExitUsage: the command line or a file it names is wrong (unknown
	// command or flag, a bad value, a policy or pods file that does not
	// parse). Nothing was started.
	ExitUsage = 2
)

// policyFileError is the error for a policy file egret cannot use: missing,
// unreadable or not parsing, it is the input given that is wrong, so every
// command that reads one (proxy, agent, run, policy --policy) exits with
// ExitUsage and says it the same way.
func policyFileError(file string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return cli.Exit(fmt.Sprintf("policy: %s: no such file", file), ExitUsage)
	}
	return cli.Exit(fmt.Sprintf("policy: %v", err), ExitUsage)
}

// usageError is a mistake in the command line: printed once, with a
// one-line hint naming the help to read, and exit status ExitUsage.
type usageError struct {
	msg string
	// cmd is the command whose help the hint names ("egret proxy");
	// filled in by the wrapper around each action when empty.
	cmd string
}

func (e *usageError) Error() string { return e.msg }

// ExitCode makes usageError a cli.ExitCoder.
func (e *usageError) ExitCode() int { return ExitUsage }

// hint is the line printed after the error.
func (e *usageError) hint() string {
	if e.cmd == "" {
		e.cmd = "egret"
	}
	return fmt.Sprintf("Run '%s --help' for usage.", e.cmd)
}

// usage is a usage error of the running command.
func usage(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// withManners gives cmd and every command under it egret's usage
// handling: flag errors rewritten to say what is expected, and usage
// errors from actions tagged with the command whose help they point to.
func withManners(cmds []*cli.Command, parent string) {
	for _, c := range cmds {
		path := parent + " " + c.Name
		c.OnUsageError = func(_ *cli.Context, err error, _ bool) error {
			return flagError(c, path, err)
		}
		if act := c.Action; act != nil {
			c.Action = func(ctx *cli.Context) error {
				err := act(ctx)
				var ue *usageError
				if errors.As(err, &ue) && ue.cmd == "" {
					ue.cmd = path
				}
				return err
			}
		}
		withManners(c.Subcommands, path)
	}
}

// The flag package's parse errors (urfave/cli v2 parses with it).
var (
	reUndefined = regexp.MustCompile(`^flag provided but not defined: -{1,2}(.+)$`)
	reBadValue  = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-{1,2}([^:]+): (.*)$`)
	reNoValue   = regexp.MustCompile(`^flag needs an argument: -{1,2}(.+)$`)
)

// flagError rewrites a flag parse error of the command at path (c nil:
// the top level, whose flags are flags) to say what was expected.
func flagError(c *cli.Command, path string, err error) error {
	var flags []cli.Flag
	if c != nil {
		flags = c.Flags
	}
	msg := err.Error()
	if m := reUndefined.FindStringSubmatch(msg); m != nil {
		// The flag package says -v for -v and --v alike; a one-letter
		// flag is shown as people type it, -v.
		msg = fmt.Sprintf("unknown flag %s", dashed(m[1]))
		var names []string
		for _, f := range flags {
			names = append(names, f.Names()...)
		}
		if c == nil {
			names = append(names, "version", "help")
		}
		if s := closestFlag(m[1], names); s != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", dashed(s))
		}
	} else if m := reBadValue.FindStringSubmatch(msg); m != nil {
		what := "expected"
		if strings.Contains(m[3], "out of range") {
			what = "out of range; expected"
		}
		msg = fmt.Sprintf("--%s %s: %s %s", m[2], m[1], what, expected(flagNamed(flags, m[2])))
	} else if m := reNoValue.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("%s needs a value", dashed(m[1]))
		if e := expected(flagNamed(flags, m[1])); e != "a value" {
			msg += ": " + e
		}
	}
	return &usageError{msg: msg, cmd: path}
}

func flagNamed(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// dashed is a flag's name as typed: -v, --listen.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// closestFlag is closest for flag names; a one-letter flag, which is
// within an edit distance of every other one-letter flag, is matched only
// to the one long flag it starts (-v: --version), if only one does.
func closestFlag(typed string, names []string) string {
	if len(typed) > 1 {
		return closest(typed, names)
	}
	match := ""
	for _, n := range names {
		if len(n) > 1 && strings.HasPrefix(n, typed) {
			if match != "" {
				return ""
			}
			match = n
		}
	}
	return match
}

// placeholder is the `NAME` of a flag's usage, as urfave/cli shows it.
var placeholder = regexp.MustCompile("`([^`]+)`")

// expected says what a flag's value must look like.
func expected(f cli.Flag) string {
	if f != nil && f.Names()[0] == "listen-port" {
		return "a port number, 1 to 65535"
	}
	if sf, ok := f.(*cli.StringFlag); ok {
		switch sf.Name {
		case "listen", "metrics":
			return "HOST:PORT, such as 127.0.0.1:15001 or [::1]:15001"
		}
		// The placeholder of its usage: `FILE`, `SOCKET`, `ADDR`.
		if m := placeholder.FindStringSubmatch(sf.Usage); m != nil {
			return "a " + m[1]
		}
	}
	switch f.(type) {
	case *cli.DurationFlag:
		return "a duration with a unit, such as 5s, 250ms or 1m30s"
	case *cli.UintFlag:
		return "a whole number, 0 to 4294967295"
	case *cli.Uint64Flag:
		return "a whole number, 0 to 18446744073709551615"
	case *cli.IntFlag:
		return "a whole number"
	case *cli.BoolFlag:
		return "true or false (or the flag alone for true)"
	}
	return "a value"
}

// unknownCommand is the error for a command name that is not one: the
// closest command is suggested when one is close (as `kubectl` and `git`
// do), and the hint names the help of the command it was given to.
func unknownCommand(parent string, cmds []*cli.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q for %q", name, parent)
	var names []string
	for _, c := range cmds {
		if !c.Hidden {
			names = append(names, c.Names()...)
		}
	}
	if s := closest(name, names); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return &usageError{msg: msg, cmd: parent}
}

// closest is the candidate nearest to typed: within an edit distance of 2,
// or one that typed is a prefix of (cobra's rule, which kubectl and cilium
// follow). "" when none is close.
func closest(typed string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		d := editDistance(strings.ToLower(typed), strings.ToLower(c))
		if d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" {
		for _, c := range candidates {
			if len(typed) >= 2 && strings.HasPrefix(c, typed) {
				return c
			}
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
