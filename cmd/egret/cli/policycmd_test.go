package cli

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/egret-proxy/egret/agent"
)

// egret policy reads a policy file offline (--policy) and answers the same
// as a running egret proxy with that file does over its admin socket;
// each field says where it came from; bad input is a usage error.
func TestPolicyOfflineEqualsRunning(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte("defaults:\n  timeout: 5s\nupstreams:\n  - host: api.test\n    port: 443\n    max_attempts: 4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := egret("policy", "--policy", file, "-o", "json", "https://api.test/v1/x")
	if code != 0 {
		t.Fatalf("policy --policy: %d %s", code, errOut)
	}
	var off agent.PolicyView
	if err := json.Unmarshal([]byte(out), &off); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"max_attempts": "4 entry 6", "timeout": "5s defaults 2", "min_attempt": "50ms builtin 0", "name": "api.test:443 entry 4"}
	for _, f := range off.Fields {
		if w, ok := want[f.Name]; ok {
			got := strings.TrimSpace(fieldValue(f.Value) + " " + f.From + " " + strconv.Itoa(f.Line))
			if got != w || (f.Line != 0 && f.File != file) {
				t.Errorf("%s: %q in %s; want %q in %s", f.Name, got, f.File, w, file)
			}
			delete(want, f.Name)
		}
	}
	if len(want) != 0 || off.Dest != "api.test:443" || off.Entry != "api.test:443" || off.Upstream != "api.test:443" || off.Policy != file {
		t.Errorf("offline view %+v (fields not seen: %v)", off, want)
	}
	// Without a destination: the defaults.
	out, _, _ = egret("policy", "--policy", file, "-o", "table")
	if !regexp.MustCompile(`(?m)^Entry: +defaults$`).MatchString(out) || !regexp.MustCompile(`(?m)^timeout +5s +defaults \(`).MatchString(out) {
		t.Errorf("policy --policy FILE -o table:\n%s", out)
	}

	// The same file in a running egret proxy.
	bin := buildEgret(t)
	sock := filepath.Join(dir, "admin.sock")
	cmd := exec.Command(bin, "proxy", "--listen", "127.0.0.1:0", "--policy", file, "--admin", sock)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	waitLine(t, lines, `msg="egret admin API"`)
	on, err := exec.Command(bin, "policy", "--admin", sock, "-o", "json", "https://api.test/v1/x").Output()
	if err != nil {
		t.Fatal(err)
	}
	if off := offline(t, file); string(on) != off {
		t.Errorf("the running proxy answers\n%s\noffline:\n%s", on, off)
	}

	for _, args := range [][]string{
		{"policy", "--policy", file, "api.test"},                       // no port
		{"policy", "--policy", file, "ftp://api.test/"},                // no port the scheme implies
		{"policy", "--policy", file, "--pod", "web", "api.test:443"},   // a pod needs an agent
		{"policy", "--policy", file, "-o", "yaml", "api.test:443"},     // no such format
		{"policy", "--policy", file, "api.test:443", "other.test:443"}, // one destination
		{"observe", "--admin", sock, "--outcome", "maybe"},             // no such outcome
		{"observe", "--admin", sock, "--last", "-1"},                   // a count
	} {
		if _, errOut, code := egret(args...); code != ExitUsage || strings.Count(strings.TrimSpace(errOut), "\n") != 1 {
			t.Errorf("egret %v: status %d, %q; want a usage error", args, code, errOut)
		}
	}
}

// offline is policy --policy's answer for the test's destination.
func offline(t *testing.T, file string) string {
	t.Helper()
	out, errOut, code := egret("policy", "--policy", file, "-o", "json", "https://api.test/v1/x")
	if code != 0 {
		t.Fatalf("policy --policy: %d %s", code, errOut)
	}
	return out
}
