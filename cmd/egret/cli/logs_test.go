package cli

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ucli "github.com/urfave/cli/v2"
)

// TestProxyJSONLogsAccessErrorsAndAdmin runs the real binary with JSON
// logs, --access-log errors and --admin: a request answered at once is
// not logged, a retried one is, with the last decision's reason and its
// duration in seconds as a float; status, upstreams and explain ask the
// proxy's admin socket as they ask the agent's.
func TestProxyJSONLogsAccessErrorsAndAdmin(t *testing.T) {
	bin := buildEgret(t)
	var n atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/flaky" && n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	})}
	go up.Serve(ln)
	defer up.Close()
	dir, err := os.MkdirTemp("", "egret-adm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "proxy.sock")

	cmd := exec.Command(bin, "proxy", "--listen", "127.0.0.1:0", "--log-format", "json", "--access-log", "errors", "--admin", sock)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan map[string]any, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				m = map[string]any{"not_json": sc.Text()}
			}
			lines <- m
		}
		close(lines)
	}()
	next := func(what string, match func(map[string]any) bool) map[string]any {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("output ended before %s", what)
				}
				if l["not_json"] != nil {
					t.Fatalf("a line that is not JSON: %q", l["not_json"])
				}
				if match(l) {
					return l
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no %s", what)
			}
		}
	}
	listening := next("listening line", func(l map[string]any) bool { return l["msg"] == "egret proxy listening" })
	addr := listening["addr"].(string)
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: addr})}, Timeout: 10 * time.Second}
	ids := map[string]string{}
	for _, path := range []string{"/ok", "/flaky"} {
		resp, err := client.Get("http://" + ln.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		ids[path] = resp.Header.Get("Egret-Request-Id")
	}
	l := next("request line", func(l map[string]any) bool { return l["msg"] == "request" })
	d, isFloat := l["duration"].(float64)
	if l["id"] != ids["/flaky"] || l["reason"] != "status" || l["attempts"] != 2.0 || !isFloat || d <= 0 || d > 10 {
		t.Fatalf("the first request line is %v; want the retried request's (%s) with reason status, attempts 2, duration in seconds", l, ids["/flaky"])
	}

	admin := func(args ...string) string {
		t.Helper()
		// Flags before the arguments (urfave/cli stops at the first).
		out, err := exec.Command(bin, append([]string{args[0], "--admin", sock}, args[1:]...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("egret %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	var tv struct {
		Outcome  string `json:"outcome"`
		Attempts []struct {
			Decision string `json:"decision"`
			Reason   string `json:"reason"`
		} `json:"attempts"`
	}
	if err := json.Unmarshal([]byte(admin("explain", "--json", ids["/flaky"])), &tv); err != nil {
		t.Fatal(err)
	}
	if tv.Outcome != "relayed" || len(tv.Attempts) != 2 || tv.Attempts[0].Decision != "retry" || tv.Attempts[0].Reason != "status" {
		t.Fatalf("explain --json: %+v", tv)
	}
	if out := admin("explain", "-o", "table", ids["/ok"]); !strings.HasPrefix(out, "request "+ids["/ok"]+": GET ") || !strings.Contains(out, "outcome relayed after 1 attempt(s)") {
		t.Fatalf("explain: %q", out)
	}
	if out := admin("upstreams"); !strings.Contains(out, `"upstream": "`+ln.Addr().String()+`"`) {
		t.Fatalf("upstreams: %s", out)
	}
	if out := admin("status"); !strings.Contains(out, `"mode": "explicit"`) || !strings.Contains(out, `"traces": 2`) {
		t.Fatalf("status: %s", out)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	draining := next("draining line", func(l map[string]any) bool { return l["msg"] == "egret proxy draining" })
	if draining["grace"] != 10.0 {
		t.Errorf("grace logged as %v, want 10 (seconds, a number)", draining["grace"])
	}
	for l := range lines {
		if l["msg"] == "request" {
			t.Errorf("a second request line under --access-log errors: %v", l)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("egret proxy: %v", err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("admin socket left behind: %v", err)
	}
}

// The access log's defaults: errors for the node agent, all for the
// commands a person watches.
func TestAccessLogDefaults(t *testing.T) {
	want := map[string]string{"agent": "errors", "proxy": "all", "run": "all"}
	for _, c := range App().Commands {
		w, ok := want[c.Name]
		if !ok {
			continue
		}
		delete(want, c.Name)
		got := ""
		for _, f := range c.Flags {
			if sf, ok := f.(*ucli.StringFlag); ok && sf.Name == "access-log" {
				got = sf.Value
			}
		}
		if got != w {
			t.Errorf("egret %s --access-log defaults to %q, want %q", c.Name, got, w)
		}
	}
	if len(want) > 0 {
		t.Errorf("commands not found: %v", want)
	}
}
