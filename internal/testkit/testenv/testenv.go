// Package testenv lets tests state what they need of the machine.
//
// A test that needs root or a kernel feature calls Require. Outside CI a
// missing need skips the test with the reason; when CI asks for everything
// (CI=true or EGRET_REQUIRE_ALL=1) it fails the test instead, so that a
// privileged suite can never pass by skipping.
package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Strict reports whether missing prerequisites must fail tests.
func Strict() bool {
	for _, k := range []string{"CI", "EGRET_REQUIRE_ALL"} {
		if v, err := strconv.ParseBool(os.Getenv(k)); err == nil && v {
			return true
		}
	}
	return false
}

// Require fails (strict) or skips the test when ok is false.
func Require(t testing.TB, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if Strict() {
		t.Fatalf("prerequisite missing (CI requires it): %s", why)
	}
	t.Skipf("prerequisite missing: %s", why)
}

// RequireRoot needs euid 0.
func RequireRoot(t testing.TB) {
	t.Helper()
	Require(t, os.Geteuid() == 0, "root (euid 0)")
}

// ProgressPrefix starts every Progress line: test/gotest shows such lines
// of the test output as they come.
const ProgressPrefix = "progress: "

// Progress reports a long preparation (a build of minutes) where the person
// running the tests sees it while it happens: go test shows nothing of a
// package that passes, and nothing before it ends. The line goes to
// /dev/tty when the process has a controlling terminal (a person ran go
// test), else to stderr, where test/gotest (the README's test command and
// CI's) shows it at once.
func Progress(format string, args ...any) {
	line := ProgressPrefix + fmt.Sprintf(format, args...)
	if !strings.HasSuffix(line, "\n") {
		line += "\n"
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		fmt.Fprint(tty, line)
		tty.Close()
		return
	}
	fmt.Fprint(os.Stderr, line)
}
