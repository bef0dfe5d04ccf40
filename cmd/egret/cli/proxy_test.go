package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
	ucli "github.com/urfave/cli/v2"
)

// TestProxyCommandRetriesAndDrains runs the real binary: it says where it
// listens, shows a retry in Egret-Attempts, logs the outcome in one line,
// and on SIGTERM lets an in-flight request finish and exits 0.
func TestProxyCommandRetriesAndDrains(t *testing.T) {
	bin := buildEgret(t)
	var n atomic.Int64
	slowStarted := make(chan struct{}, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			slowStarted <- struct{}{}
			time.Sleep(400 * time.Millisecond) // not synchronisation: the slow request in flight during the drain
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
	// --pprof: Go's profiles beside /metrics; the probes' paths.
	for path, want := range map[string]string{"/debug/pprof/cmdline": "proxy", "/metrics": "egret_proxy_", HealthPath: "ok", ReadyPath: "ok"} {
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
	// The default --heap-floor is in force from the start: GOGC raised,
	// the collector's goal at 16 MiB (4 MiB with GOGC alone).
	gogc, goal := goMetric(t, profAddr, "go_gc_gogc_percent"), goMetric(t, profAddr, "go_memstats_next_gc_bytes")
	if gogc <= 100 || goal < 16<<20 {
		t.Errorf("GOGC %v, heap goal %v bytes: the default heap floor (16 MiB) is not in force", gogc, goal)
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
	want := fmt.Sprintf("id=%s method=GET url=http://%s/flaky upstream=%s attempts=2 outcome=relayed reason=status status=200", id, ln.Addr(), ln.Addr())
	waitLine(t, lines, want)
	// Its own metrics and pprof address is out of the clients' reach:
	// by request, and by CONNECT (whose port 443 only is allowed).
	if resp, err := client.Get("http://" + profAddr + "/debug/pprof/cmdline"); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("GET egret's pprof through egret: %v %v", resp, err)
	}
	for _, target := range []string{profAddr, addr, "example.com:22"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		cr, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		c.Close()
		if err != nil || cr.StatusCode != http.StatusForbidden {
			t.Fatalf("CONNECT %s through egret: %v %v", target, cr, err)
		}
	}

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
	// Draining: not ready any more, still alive.
	probe := func(path string) (int, string) {
		resp, err := http.Get("http://" + profAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	// Polls: the readiness probe is the only view of the drain, which
	// lasts while the slow request (400 ms) is in flight.
	var readyCode int
	var readyBody string
	if !testenv.Poll(300*time.Millisecond, func() bool {
		readyCode, readyBody = probe(ReadyPath)
		return readyCode == http.StatusServiceUnavailable && strings.Contains(readyBody, "draining")
	}) {
		t.Fatalf("%s while draining: %d %q", ReadyPath, readyCode, readyBody)
	}
	if code, body := probe(HealthPath); code != 200 {
		t.Fatalf("%s while draining: %d %q", HealthPath, code, body)
	}
	if got := <-slow; got != "slow done" {
		t.Fatalf("in-flight request during drain: %q", got)
	}
	waitLine(t, lines, `msg="egret proxy stopped"`)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("egret proxy after SIGTERM: %v, want exit 0", err)
	}
}

// buildEgret builds the egret binary once for the package's tests.
func buildEgret(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "egret-cli-test-")
		if err != nil {
			buildErr = err
			return
		}
		built = filepath.Join(dir, "egret")
		if out, err := exec.Command("go", "build", "-o", built, "..").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if built != "" {
		os.RemoveAll(filepath.Dir(built))
	}
	os.Exit(code)
}

// TestIdleConnectionsHoldNoGoroutine runs `egret proxy` as a user would
// (witness, text log, metrics) and opens idle keep-alive connections, each
// after one request: once idle past the park time (1 s by default) they
// are parked in egret's epoll set and hold no goroutine (issue 14: memory
// per idle connection). Before parking each held its goroutine, and this
// test bounded that goroutine's stack at 8 KiB; with parking, the
// goroutine's stack is given back instead. Then each parked connection
// still serves a request.
func TestIdleConnectionsHoldNoGoroutine(t *testing.T) {
	bin := buildEgret(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	go up.Serve(ln)
	defer up.Close()
	cmd := exec.Command(bin, "proxy", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	addrRe := regexp.MustCompile(`msg="egret proxy listening" addr=(\S+)`)
	metricsRe := regexp.MustCompile(`msg="egret metrics" addr=(\S+)`)
	var addr, metrics string
	sc := bufio.NewScanner(stderr)
	for (addr == "" || metrics == "") && sc.Scan() {
		if m := addrRe.FindStringSubmatch(sc.Text()); m != nil {
			addr = m[1]
		}
		if m := metricsRe.FindStringSubmatch(sc.Text()); m != nil {
			metrics = m[1]
		}
	}
	go io.Copy(io.Discard, stderr)
	if addr == "" || metrics == "" {
		t.Fatal("egret proxy did not say where it listens")
	}
	goroutines := func() float64 { return goMetric(t, metrics, "go_goroutines") }
	one := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: x\r\n\r\n", ln.Addr())
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		return c
	}
	before := goroutines()
	const n = 1000
	conns := make([]net.Conn, 0, n)
	for range n {
		c := one()
		defer c.Close()
		conns = append(conns, c)
	}
	// The count of goroutines signals nothing: it is read until the
	// connections have parked.
	var now float64
	testenv.Eventually(t, 30*time.Second, "the idle connections parked (go_goroutines back near its count before them)", func() bool {
		now = goroutines()
		return now-before < n/100
	})
	t.Logf("goroutines: %.0f before %d idle connections, %.0f with them parked", before, n, now)
	// Parked, each still serves its next request.
	for i, c := range conns {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: x\r\n\r\n", ln.Addr())
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("parked connection %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != "ok" {
			t.Fatalf("parked connection %d: %d %q", i, resp.StatusCode, b)
		}
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
	if err == nil || !strings.Contains(err.Error(), "not a loopback address") {
		t.Fatalf("non-loopback listen: %v", err)
	}
}

// goMetric reads one unlabelled sample from the /metrics at addr.
func goMetric(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

func TestHeapFloorFlag(t *testing.T) {
	for _, args := range [][]string{
		{"proxy", "--heap-floor", "lots"},
		{"agent", "--pods", "/nonexistent/pods.yaml", "--heap-floor", "2GiB"},
		{"run", "--heap-floor", "32 parsecs", "--", "true"},
	} {
		app := App()
		app.ExitErrHandler = func(*ucli.Context, error) {}
		err := app.Run(append([]string{"egret"}, args...))
		var ec ucli.ExitCoder
		if err == nil || !strings.Contains(err.Error(), "--heap-floor: ") || !errors.As(err, &ec) || ec.ExitCode() != 2 {
			t.Errorf("%v: %v, want a --heap-floor error with status 2", args, err)
		}
	}
}
