package cli

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// egret runs the command line in-process as Main does, with its own
// stdout and stderr.
func egret(args ...string) (stdout, stderr string, code int) {
	app := App()
	var o, e bytes.Buffer
	app.Writer = &o
	code = run(app, append([]string{"egret"}, args...), &e)
	return o.String(), e.String(), code
}

// TestUsageErrors: a mistake in the command line is printed once, as one
// line saying what was expected, then one line naming the help to read;
// no help text, nothing on stdout, exit status 2 (as go, kubectl and
// cilium).
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string // the first line of stderr
		help string // the command whose help the hint names
	}{
		{[]string{"--bogus"}, "unknown flag --bogus", "egret"},
		{[]string{"prxy"}, `unknown command "prxy" for "egret" (did you mean "proxy"?)`, "egret"},
		{[]string{"simulat"}, `unknown command "simulat" for "egret" (did you mean "simulate"?)`, "egret"},
		{[]string{"frobnicate"}, `unknown command "frobnicate" for "egret"`, "egret"},
		{[]string{"agent", "stauts"}, `unknown command "stauts" for "egret agent" (did you mean "status"?)`, "egret agent"},
		{[]string{"proxy", "--bogus"}, "unknown flag --bogus", "egret proxy"},
		{[]string{"proxy", "--lisen", "x"}, "unknown flag --lisen (did you mean --listen?)", "egret proxy"},
		{[]string{"proxy", "--grace", "5"}, "--grace 5: expected a duration with a unit, such as 5s, 250ms or 1m30s", "egret proxy"},
		{[]string{"agent", "--grace", "5"}, "--grace 5: expected a duration with a unit, such as 5s, 250ms or 1m30s", "egret agent"},
		{[]string{"proxy", "--grace"}, "--grace needs a value: a duration with a unit, such as 5s, 250ms or 1m30s", "egret proxy"},
		{[]string{"proxy", "--listen", "nonsense"}, "--listen nonsense: expected HOST:PORT, such as 127.0.0.1:15001 or [::1]:15001", "egret proxy"},
		{[]string{"proxy", "--listen", "10.1.2.3:80"}, "--listen 10.1.2.3:80: not a loopback address; pass --allow-remote to serve remote clients (an open proxy to whoever reaches it)", "egret proxy"},
		{[]string{"proxy", "--metrics", "9090"}, "--metrics 9090: expected HOST:PORT, such as 127.0.0.1:15001 or [::1]:15001", "egret proxy"},
		{[]string{"proxy", "--log-format", "xml"}, "--log-format xml: expected text or json", "egret proxy"},
		{[]string{"proxy", "--log-level", "loud"}, "--log-level loud: expected debug, info, warn or error", "egret proxy"},
		{[]string{"agent", "--pods", "p.yaml", "--log-level", "trace"}, "--log-level trace: expected debug, info, warn or error", "egret agent"},
		{[]string{"proxy", "--access-log", "some"}, "--access-log some: expected all, errors or off", "egret proxy"},
		{[]string{"agent", "--pods", "p.yaml", "--access-log", "most"}, "--access-log most: expected all, errors or off", "egret agent"},
		{[]string{"run", "--access-log", "x", "--", "true"}, "--access-log x: expected all, errors or off", "egret run"},
		{[]string{"proxy", "--metrics-upstreams", "0"}, "--metrics-upstreams 0: expected 1 or more", "egret proxy"},
		{[]string{"proxy", "extra"}, "proxy takes no arguments", "egret proxy"},
		{[]string{"proxy", "--allow-remote=maybe"}, `--allow-remote maybe: expected true or false (or the flag alone for true)`, "egret proxy"},
		{[]string{"agent", "--pods", "p.yaml", "--listen-port", "70000"}, "--listen-port 70000: expected a port number, 1 to 65535", "egret agent"},
		{[]string{"agent", "--pods", "p.yaml", "--listen-port", "-1"}, "--listen-port -1: expected a port number, 1 to 65535", "egret agent"},
		{[]string{"simulate", "--seed", "x"}, "--seed x: expected a whole number, 0 to 18446744073709551615", "egret simulate"},
		{[]string{"simulate", "a", "b"}, "simulate takes at most one FILE", "egret simulate"},
		{[]string{"status", "x"}, "status takes no arguments", "egret status"},
		{[]string{"agent", "status", "--bogus"}, "unknown flag --bogus", "egret agent status"},
		{[]string{"explain"}, "explain needs one REQUEST-ID (the Egret-Request-Id of an answer, such as 8e13ac3b035fce95)", "egret explain"},
		{[]string{"explain", "x/../../status"}, `explain "x/../../status": expected a request id, the 16 hex digits of an Egret-Request-Id such as 8e13ac3b035fce95`, "egret explain"},
		{[]string{"run", "--netns", "other", "--", "true"}, "--netns other: expected host or new", "egret run"},
		{[]string{"version", "x"}, "version takes no arguments", "egret version"},
		// A one-letter flag is echoed as typed, and suggested only what
		// it abbreviates.
		{[]string{"-v"}, "unknown flag -v (did you mean --version?)", "egret"},
		{[]string{"proxy", "-v"}, "unknown flag -v", "egret proxy"},
		// A missing value says what the value looks like.
		{[]string{"proxy", "--listen"}, "--listen needs a value: HOST:PORT, such as 127.0.0.1:15001 or [::1]:15001", "egret proxy"},
		{[]string{"proxy", "--policy"}, "--policy needs a value: a FILE", "egret proxy"},
		{[]string{"status", "--admin"}, "--admin needs a value: a SOCKET", "egret status"},
		{[]string{"help", "prxy"}, `unknown command "prxy" for "egret" (did you mean "proxy"?)`, "egret"},
	} {
		out, errOut, code := egret(tc.args...)
		want := "egret: " + tc.msg + "\nRun '" + tc.help + " --help' for usage.\n"
		if code != 2 || errOut != want || out != "" {
			t.Errorf("egret %s:\n exit %d, stdout %q\n stderr %q\n want exit 2, stderr %q", strings.Join(tc.args, " "), code, out, errOut, want)
		}
	}
}

// TestBareEgretPrintsHelpAndFails: `egret` alone is a usage error, as
// `go` alone: the help on stderr, status 2. `egret --help` is a request:
// the help on stdout, status 0.
func TestBareEgretPrintsHelpAndFails(t *testing.T) {
	out, errOut, code := egret()
	if code != 2 || out != "" || !strings.Contains(errOut, "USAGE:") || !strings.Contains(errOut, "proxy") {
		t.Errorf("egret: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = egret("--help")
	if code != 0 || errOut != "" || !strings.Contains(out, "USAGE:") {
		t.Errorf("egret --help: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out, errOut, code := egret(args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "egret version ") || strings.Count(out, "\n") != 1 {
			t.Errorf("egret %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

// TestVersionStampedAtBuild builds the binary as a release does, with
// -ldflags -X, and reads the stamp back.
func TestVersionStampedAtBuild(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "egret")
	cmd := exec.Command("go", "build", "-o", bin, "-ldflags", "-X github.com/egret-proxy/egret/cmd/egret/cli.Version=v9.8.7-test", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "egret version v9.8.7-test go") {
		t.Fatalf("--version: %q, %v", out, err)
	}
}

// TestPolicyErrorReportedOnce: a policy that does not parse stops egret
// with one line naming the file and the right line, and exit status 2.
func TestPolicyErrorReportedOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	// The unclosed list starts on line 3.
	if err := os.WriteFile(path, []byte("defaults:\n  max_attempts: 3\n  routes: [1\n  timeout: 2s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := egret("proxy", "--listen", "127.0.0.1:0", "--policy", path)
	want := "egret: policy: " + path + ":3: did not find expected ',' or ']'\n"
	if code != 2 || errOut != want || out != "" {
		t.Errorf("exit %d, stdout %q\nstderr %q\nwant   %q", code, out, errOut, want)
	}
}

// TestExplainAsksOnlyForRequestIDs: explain puts nothing but a request id
// into the admin API's path; what it refuses never reaches the agent.
func TestExplainAsksOnlyForRequestIDs(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var paths []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		w.Write([]byte(`{"request_id":"8e13ac3b035fce95","pod":"default/web","method":"GET"}`))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	for _, id := range []string{"x/../../status", "../status", "8e13ac3b035fce9", "8E13AC3B035FCE95", "8e13ac3b035fce95?x=1"} {
		if _, _, code := egret("explain", "--admin", sock, id); code != 2 {
			t.Errorf("explain %q: exit %d, want 2", id, code)
		}
	}
	out, errOut, code := egret("explain", "--admin", sock, "-o", "table", "8e13ac3b035fce95")
	if code != 0 || !strings.HasPrefix(out, "request 8e13ac3b035fce95 from pod default/web") {
		t.Errorf("explain: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 || paths[0] != "/explain/8e13ac3b035fce95" {
		t.Errorf("the agent was asked for %q, want only /explain/8e13ac3b035fce95", paths)
	}
}

func TestClosest(t *testing.T) {
	cmds := []string{"simulate", "proxy", "agent", "run", "status", "pods", "upstreams", "explain", "version"}
	for typed, want := range map[string]string{
		"prxy": "proxy", "agnet": "agent", "stat": "status", "upstream": "upstreams",
		"explian": "explain", "rnu": "run", "xyzzy": "", "s": "", "allow-remote": "",
	} {
		if got := closest(typed, cmds); got != want {
			t.Errorf("closest(%q) = %q, want %q", typed, got, want)
		}
	}
	// --listen nonsense names no flag: nothing may suggest --allow-remote.
	if got := closest("nonsense", []string{"listen", "allow-remote", "policy", "metrics"}); got != "" {
		t.Errorf("closest(nonsense) = %q", got)
	}
}

// TestHelpCommand: `egret help [COMMAND]` is `egret [COMMAND] --help`, as
// `go help` is: the help on stdout, status 0; egret's help lists it among
// its commands, and --help and -h still work everywhere.
func TestHelpCommand(t *testing.T) {
	top, _, _ := egret("--help")
	cmds, _, _ := strings.Cut(top, "GLOBAL OPTIONS:")
	if !regexp.MustCompile(`(?m)^\s+help\s+show the help of egret`).MatchString(cmds) {
		t.Errorf("egret --help does not list help among its commands:\n%s", top)
	}
	for _, args := range [][]string{{"-h"}, {"proxy", "-h"}, {"agent", "status", "--help"}} {
		if out, errOut, code := egret(args...); code != 0 || errOut != "" || !strings.Contains(out, "USAGE:") {
			t.Errorf("egret %v: exit %d, stderr %q, stdout %q; want the help", args, code, errOut, out)
		}
	}
	for _, tc := range [][]string{{}, {"proxy"}, {"agent", "status"}} {
		out, errOut, code := egret(append([]string{"help"}, tc...)...)
		want, _, _ := egret(append(tc, "--help")...)
		if code != 0 || errOut != "" || !strings.Contains(out, "USAGE:") || out != want {
			t.Errorf("egret help %v: exit %d, stderr %q, stdout %q; want the stdout of egret %v --help, %q", tc, code, errOut, out, tc, want)
		}
	}
}

// TestMissingPolicyFileIsAUsageError: every command that reads a policy
// file says the same of a missing one, with the same status, 2 (the
// input given is wrong; nothing was started).
func TestMissingPolicyFileIsAUsageError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	want := "egret: policy: " + missing + ": no such file\n"
	for _, args := range [][]string{
		{"proxy", "--listen", "127.0.0.1:0", "--policy", missing},
		{"policy", "--policy", missing, "127.0.0.1:80"},
	} {
		out, errOut, code := egret(args...)
		if code != 2 || errOut != want || out != "" {
			t.Errorf("egret %s: exit %d, stdout %q, stderr %q; want exit 2, stderr %q", strings.Join(args, " "), code, out, errOut, want)
		}
	}
}

// TestAdminErrorsInEgretsWords: an admin socket that does not answer is
// reported as egret's (which socket, what is wrong, what to check), not as
// the HTTP request egret makes over it.
func TestAdminErrorsInEgretsWords(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.sock")
	// A socket file nobody listens on, as a killed egret leaves it.
	dead := filepath.Join(dir, "dead.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: dead, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	for _, tc := range []struct {
		sock, says string
	}{
		{missing, "no such socket: is egret agent, or egret proxy --admin " + missing + ", running?"},
		{dead, "nothing listens on it"},
	} {
		for _, cmd := range [][]string{{"status"}, {"upstreams"}, {"observe"}, {"top", "--once"}, {"explain"}} {
			args := append(append([]string{}, cmd...), "--admin", tc.sock)
			if cmd[0] == "explain" {
				args = append(args, "8e13ac3b035fce95")
			}
			_, errOut, code := egret(args...)
			prefix := "egret: cannot ask egret at admin socket " + tc.sock + ": "
			if code != 1 || !strings.HasPrefix(errOut, prefix) || !strings.Contains(errOut, tc.says) || strings.Contains(errOut, "http") || strings.Count(errOut, "\n") != 1 {
				t.Errorf("egret %s: exit %d, stderr %q; want exit 1 and one line starting %q, saying %q, no HTTP", strings.Join(args, " "), code, errOut, prefix, tc.says)
			}
		}
	}
}
