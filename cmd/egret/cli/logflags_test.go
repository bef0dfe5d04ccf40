package cli

import (
	"flag"
	"testing"

	"github.com/urfave/cli/v2"
)

// CheckLogFlags takes exactly what the logging commands take: every level
// and format they accept, and it refuses what they refuse with their
// message.
func TestCheckLogFlags(t *testing.T) {
	ctx := func(args ...string) *cli.Context {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		for _, f := range []cli.Flag{logFormatFlag, logLevelFlag} {
			if err := f.Apply(fs); err != nil {
				t.Fatal(err)
			}
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return cli.NewContext(App(), fs, nil)
	}
	if err := CheckLogFlags(ctx()); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	for _, f := range []string{"text", "json"} {
		for _, l := range []string{"debug", "info", "warn", "error"} {
			if err := CheckLogFlags(ctx("--log-format="+f, "--log-level="+l)); err != nil {
				t.Errorf("--log-format=%s --log-level=%s: %v", f, l, err)
			}
		}
	}
	for args, want := range map[[2]string]string{
		{"--log-format=xml", "--log-level=info"}:   "--log-format xml: expected text or json",
		{"--log-format=json", "--log-level=trace"}: "--log-level trace: expected debug, info, warn or error",
		{"--log-format=JSON", "--log-level=info"}:  "--log-format JSON: expected text or json",
	} {
		if err := CheckLogFlags(ctx(args[0], args[1])); err == nil || err.Error() != want {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
}
