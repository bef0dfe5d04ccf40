// Package h2spectest runs h2spec (github.com/summerwind/h2spec, an HTTP/2
// conformance tester) against a server under test and returns each case's
// result. h2spec is built from source by the tools module beside this file
// (internal/testkit/toolbuild: once per machine, then cached), at the
// version its go.mod pins.
package h2spectest

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/internal/testkit/toolbuild"
)

const modulePath = "github.com/summerwind/h2spec"

// Binary returns the path of h2spec, building it if this machine has not
// yet. A failed build skips the test, or fails it under CI.
func Binary(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "tools")
	m := toolbuild.Module{Name: "h2spec", Dir: dir, LDFlags: func() (string, error) {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			return "", err
		}
		v := toolbuild.ModVersion(mod, modulePath)
		if v == "" {
			return "", fmt.Errorf("%s/go.mod requires no %s", dir, modulePath)
		}
		return "-X main.VERSION=" + strings.TrimSuffix(strings.TrimPrefix(v, "v"), "+incompatible"), nil
	}, BuildArgs: []string{"-trimpath"}, Env: []string{"CGO_ENABLED=0"}, Readme: "internal/testkit/README.md"}
	paths, err := m.Build(toolbuild.Program{Pkg: modulePath + "/cmd/h2spec", Out: "h2spec", Name: "h2spec"})
	testenv.Require(t, err == nil, fmt.Sprintf("h2spec built from %s: %v", dir, err))
	return paths["h2spec"]
}

// Case is one h2spec test case and its result.
type Case struct {
	// ID is the case's section and number, as h2spec names it in its
	// arguments: "http2/5.1.1/2".
	ID string
	// Title is what it checks, e.g. "Sends a DATA frame on a stream in
	// idle state".
	Title string
	// Failed holds h2spec's reason when the case failed (expected and
	// actual), else is empty.
	Failed string
	// Skipped is true when h2spec did not run the case.
	Skipped bool
}

// Result is one h2spec run.
type Result struct {
	Cases []Case
	// Output is h2spec's console output.
	Output string
}

// Failures returns the failed cases.
func (r Result) Failures() []Case {
	var out []Case
	for _, c := range r.Cases {
		if c.Failed != "" {
			out = append(out, c)
		}
	}
	return out
}

// Run runs h2spec with prior knowledge over cleartext (h2c) against
// host:port, each case given timeout, and returns every case's result. It
// fails the test only when h2spec could not run or its report cannot be
// read; failing cases are the caller's to judge. Extra arguments (spec
// sections such as "http2/5.1") are passed on.
func Run(t testing.TB, ctx context.Context, host string, port int, timeout time.Duration, args ...string) Result {
	t.Helper()
	bin := Binary(t)
	report := filepath.Join(t.TempDir(), "h2spec.xml")
	secs := int(timeout / time.Second)
	if secs < 1 {
		secs = 1
	}
	argv := append([]string{"-h", host, "-p", strconv.Itoa(port), "-o", strconv.Itoa(secs), "-j", report}, args...)
	cmd := exec.CommandContext(ctx, bin, argv...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "TERM=dumb")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	// h2spec exits 1 when a case failed: that is a result, not an error.
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		t.Fatalf("h2spec %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	b, rerr := os.ReadFile(report)
	if rerr != nil {
		t.Fatalf("h2spec wrote no report (%v); its output:\n%s", rerr, out)
	}
	cases, perr := parseJUnit(b)
	if perr != nil {
		t.Fatalf("h2spec report: %v", perr)
	}
	return Result{Cases: cases, Output: string(out)}
}

// The JUnit report h2spec writes: one testsuite per section, one testcase
// per case; a failed case holds a failure element, a skipped one a skipped
// element.
type junitSuites struct {
	Suites []struct {
		Package string `xml:"package,attr"`
		ID      string `xml:"id,attr"`
		Name    string `xml:"name,attr"`
		Cases   []struct {
			Package   string `xml:"package,attr"`
			ClassName string `xml:"classname,attr"`
			Failure   *struct {
				Text string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Text string `xml:",chardata"`
			} `xml:"error"`
			Skipped *struct{} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func parseJUnit(b []byte) ([]Case, error) {
	var s junitSuites
	if err := xml.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	var out []Case
	for _, su := range s.Suites {
		for i, c := range su.Cases {
			// h2spec numbers a section's cases from 1 (http2/8.1.2.2/1).
			pkg := c.Package
			if pkg == "" {
				pkg = su.Package
			}
			id := pkg + "/" + strconv.Itoa(i+1)
			k := Case{ID: id, Title: strings.TrimSpace(su.Name + ": " + c.ClassName), Skipped: c.Skipped != nil}
			switch {
			case c.Failure != nil:
				k.Failed = strings.TrimSpace(c.Failure.Text)
				if k.Failed == "" {
					k.Failed = "failed"
				}
			case c.Error != nil:
				k.Failed = strings.TrimSpace(c.Error.Text)
				if k.Failed == "" {
					k.Failed = "error"
				}
			}
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no test case in the report")
	}
	return out, nil
}
