// Package testenv lets tests state what they need of the machine.
//
// A test that needs root or a kernel feature calls Require. Outside CI a
// missing need skips the test with the reason; when CI asks for everything
// (CI=true or EGRET_REQUIRE_ALL=1) it fails the test instead, so that a
// privileged suite can never pass by skipping.
package testenv

import (
	"os"
	"strconv"
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
