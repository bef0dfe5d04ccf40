package cli

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ucli "github.com/urfave/cli/v2"
)

// TestProxyCommandRetriesAndDrains runs the real binary: it says where it
// listens, shows a retry in Egret-Attempts, logs the outcome in one line,
// and on SIGTERM lets an in-flight request finish and exits 0.
func TestProxyCommandRetriesAndDrains(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "egret")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/egret").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var n atomic.Int64
	slowStarted := make(chan struct{}, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			slowStarted <- struct{}{}
			time.Sleep(400 * time.Millisecond)
			io.WriteString(w, "slow done")
			return
		}
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	})}
	go up.Serve(ln)
	defer up.Close()

	cmd := exec.Command(bin, "proxy", "--listen", "127.0.0.1:0", "--grace", "5s", "--metrics", "127.0.0.1:0", "--pprof")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	addrRe := regexp.MustCompile(`msg="egret proxy listening" addr=(\S+)`)
	profRe := regexp.MustCompile(`msg="egret profiles" addr=(\S+)`)
	var addr, profAddr string
	for addr == "" || profAddr == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("egret proxy exited before listening")
			}
			if m := addrRe.FindStringSubmatch(l); m != nil {
				addr = m[1]
			}
			if m := profRe.FindStringSubmatch(l); m != nil {
				profAddr = m[1]
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no listening line (proxy %q, profiles %q)", addr, profAddr)
		}
	}
	// --pprof: Go's profiles beside /metrics.
	for path, want := range map[string]string{"/debug/pprof/cmdline": "proxy", "/metrics": "egret_proxy_"} {
		resp, err := http.Get("http://" + profAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Fatalf("GET %s: %d, body without %q", path, resp.StatusCode, want)
		}
	}
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: addr})}, Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + ln.Addr().String() + "/flaky")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok" || resp.Header.Get("Egret-Attempts") != "2" {
		t.Fatalf("got %d %q Egret-Attempts=%q, want 200 ok after 2 attempts", resp.StatusCode, body, resp.Header.Get("Egret-Attempts"))
	}
	id := resp.Header.Get("Egret-Request-Id")
	want := fmt.Sprintf("id=%s method=GET url=http://%s/flaky upstream=%s attempts=2 outcome=relayed status=200", id, ln.Addr(), ln.Addr())
	waitLine(t, lines, want)

	slow := make(chan string, 1)
	go func() {
		resp, err := client.Get("http://" + ln.Addr().String() + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		slow <- string(b)
	}()
	<-slowStarted
	cmd.Process.Signal(syscall.SIGTERM)
	if got := <-slow; got != "slow done" {
		t.Fatalf("in-flight request during drain: %q", got)
	}
	waitLine(t, lines, `msg="egret proxy stopped"`)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("egret proxy after SIGTERM: %v, want exit 0", err)
	}
}

func waitLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("output ended without %q", want)
			}
			if strings.Contains(l, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no line with %q", want)
		}
	}
}

func TestPprofNeedsMetrics(t *testing.T) {
	for _, cmd := range []string{"proxy", "agent"} {
		app := App()
		app.ExitErrHandler = func(*ucli.Context, error) {}
		err := app.Run([]string{"egret", cmd, "--pprof"})
		if err == nil || !strings.Contains(err.Error(), "--pprof needs --metrics") {
			t.Fatalf("%s --pprof without --metrics: %v", cmd, err)
		}
	}
}

func TestProxyCommandRefusesRemoteListen(t *testing.T) {
	app := App()
	app.ExitErrHandler = func(*ucli.Context, error) {}
	err := app.Run([]string{"egret", "proxy", "--listen", "0.0.0.0:0"})
	if err == nil || !strings.Contains(err.Error(), "not loopback") {
		t.Fatalf("non-loopback listen: %v", err)
	}
}
