// Command gotest runs `go test -json` with the arguments it is given and
// shows what plain `go test` shows (a line per package; the output of the
// tests that failed), plus two things plain `go test` hides:
//
//   - the progress lines of long preparations (internal/testkit/testenv.Progress,
//     such as the kube-apiserver build), as they come, even in a package
//     that passes;
//   - at the end, every test that skipped and why (a test whose
//     prerequisite is missing skips outside CI, and `ok` alone would look
//     like a pass).
//
// It exits with go test's status. The README's test command and .ci/run
// use it:
//
//	go run ./test/gotest -race -count=1 -timeout 60m ./...
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output and build-fail events
}

// skip is a test that skipped, with the lines it logged.
type skip struct {
	pkg, test, why string
}

func main() {
	args := append([]string{"test", "-json"}, os.Args[1:]...)
	cmd := exec.Command("go", args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gotest:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "gotest:", err)
		os.Exit(2)
	}
	skips := report(out, os.Stdout)
	werr := cmd.Wait()
	printSkips(os.Stdout, skips)
	code := 0
	if werr != nil {
		code = 1
		if ee, ok := werr.(*exec.ExitError); ok {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Exited() {
				code = ws.ExitStatus()
			}
		} else {
			fmt.Fprintln(os.Stderr, "gotest:", werr)
		}
	}
	os.Exit(code)
}

// report reads go test's JSON events from r and writes to w what a person
// needs, returning the tests that skipped.
func report(r io.Reader, w io.Writer) []skip {
	type key struct{ pkg, test string }
	logs := map[key]*strings.Builder{}
	var skips []skip
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			// Not an event (go vet or build output): show it as is.
			fmt.Fprintln(w, sc.Text())
			continue
		}
		k := key{ev.Package, ev.Test}
		switch ev.Action {
		case "build-output":
			fmt.Fprint(w, ev.Output)
		case "output":
			if p, ok := strings.CutPrefix(strings.TrimLeft(ev.Output, " "), "progress: "); ok {
				fmt.Fprint(w, ev.Package+": "+p)
			}
			if ev.Test == "" {
				// The package's own lines: ok, FAIL, panics, coverage.
				if !strings.HasPrefix(ev.Output, "=== ") && !strings.HasPrefix(ev.Output, "--- ") &&
					ev.Output != "PASS\n" && !strings.Contains(ev.Output, "progress: ") {
					fmt.Fprint(w, ev.Output)
				}
				continue
			}
			b := logs[k]
			if b == nil {
				b = &strings.Builder{}
				logs[k] = b
			}
			b.WriteString(ev.Output)
		case "fail":
			if ev.Test != "" {
				if b := logs[k]; b != nil {
					fmt.Fprint(w, b.String())
				}
			}
			delete(logs, k)
		case "skip":
			if ev.Test != "" {
				skips = append(skips, skip{ev.Package, ev.Test, skipReason(logs[k])})
			}
			delete(logs, k)
		case "pass":
			delete(logs, k)
		}
	}
	return skips
}

// skipReason is what a skipped test logged, without the framing lines.
func skipReason(b *strings.Builder) string {
	if b == nil {
		return "(no reason given)"
	}
	var why []string
	for _, l := range strings.Split(b.String(), "\n") {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		why = append(why, t)
	}
	if len(why) == 0 {
		return "(no reason given)"
	}
	return strings.Join(why, " / ")
}

func printSkips(w io.Writer, skips []skip) {
	if len(skips) == 0 {
		fmt.Fprintln(w, "gotest: no test skipped")
		return
	}
	sort.Slice(skips, func(i, j int) bool {
		if skips[i].pkg != skips[j].pkg {
			return skips[i].pkg < skips[j].pkg
		}
		return skips[i].test < skips[j].test
	})
	fmt.Fprintf(w, "gotest: %d test(s) skipped (they did not run: not a pass):\n", len(skips))
	for _, s := range skips {
		fmt.Fprintf(w, "  %s %s: %s\n", s.pkg, s.test, s.why)
	}
}
