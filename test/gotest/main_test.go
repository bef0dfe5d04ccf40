package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReportOfARealRun runs real `go test -json` on a module with a test
// that passes, one that fails, one that skips (and a subtest that does)
// and one that reports progress, and checks what gotest shows of it.
func TestReportOfARealRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.test/m\n\ngo 1.22\n")
	write("m_test.go", `package m

import (
	"fmt"
	"os"
	"testing"
)

func TestPasses(t *testing.T) { t.Log("quiet when it passes") }
func TestFails(t *testing.T)  { t.Error("this one broke") }
func TestSkips(t *testing.T)  { t.Skip("prerequisite missing: promtool") }
func TestSub(t *testing.T) {
	t.Run("inner", func(t *testing.T) { t.Skipf("prerequisite missing: %s", "root (euid 0)") })
}
func TestProgress(t *testing.T) { fmt.Fprintln(os.Stderr, "progress: building the world (about 4 minutes)") }
`)
	cmd := exec.Command("go", "test", "-json", "-count=1", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var shown strings.Builder
	skips := report(out, &shown)
	if err := cmd.Wait(); err == nil {
		t.Fatal("go test passed with a failing test")
	}
	printSkips(&shown, skips)
	got := shown.String()
	for _, want := range []string{
		"this one broke",
		"FAIL\texample.test/m",
		"example.test/m: building the world (about 4 minutes)",
		"gotest: 2 test(s) skipped",
		"  example.test/m TestSkips: m_test.go:11: prerequisite missing: promtool\n",
		"  example.test/m TestSub/inner: m_test.go:13: prerequisite missing: root (euid 0)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet when it passes") {
		t.Errorf("a passing test's log is shown:\n%s", got)
	}
}
