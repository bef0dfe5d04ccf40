package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/urfave/cli/v2"
)

// Version is egret's version. A release build stamps it:
//
//	go build -ldflags "-X github.com/egret-proxy/egret/cmd/egret/cli.Version=v0.3.0" ./cmd/egret
//
// Left empty, egret reports what Go recorded in the binary: the module
// version for `go install …@version`, else the VCS revision of the build
// (with "+dirty" for uncommitted changes), else "devel".
var Version string

// version is Version, or what the build information says.
func version() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		return "devel"
	}
	return "devel-" + rev + dirty
}

// versionLine is what --version and `egret version` print, as `go version`
// does: the version, the Go that built it, the platform.
func versionLine() string {
	return fmt.Sprintf("egret version %s %s %s/%s", version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print egret's version (also --version)",
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usage("version takes no arguments")
			}
			fmt.Fprintln(c.App.Writer, versionLine())
			return nil
		},
	}
}
