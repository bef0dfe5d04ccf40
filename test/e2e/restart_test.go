package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/test/ledger"
)

var (
	buildOnce sync.Once
	egretBin  string
	buildErr  error
)

// egretBinary builds cmd/egret once per test run.
func egretBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", Prefix+"bin-")
		if err != nil {
			buildErr = err
			return
		}
		_ = os.Chmod(dir, 0o755) // others may run it (the tests without root)
		egretBin = filepath.Join(dir, "egret")
		out, err := exec.Command("go", "build", "-o", egretBin, "github.com/egret-proxy/egret/cmd/egret").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return egretBin
}

// agentProc is `egret agent` run as a real process.
type agentProc struct {
	cmd   *exec.Cmd
	log   *syncBuffer
	admin string
}

// syncBuffer is a process's output, safe for concurrent use; each write
// wakes Await.
type syncBuffer struct {
	mu   sync.Mutex
	b    bytes.Buffer
	grew chan struct{} // closed (and dropped) at each write
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grew != nil {
		close(s.grew)
		s.grew = nil
	}
	return s.b.Write(p)
}

// Await waits until cond holds of the output, asking it again as each
// write arrives (the process's pipe is the event), for at most timeout;
// it says whether cond held.
func (s *syncBuffer) Await(timeout time.Duration, cond func(out string) bool) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.grew == nil {
			s.grew = make(chan struct{})
		}
		grew, out := s.grew, s.b.String()
		s.mu.Unlock()
		if cond(out) {
			return true
		}
		select {
		case <-grew:
		case <-timer.C:
			return cond(s.String())
		}
	}
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startAgent(t *testing.T, args ...string) *agentProc {
	t.Helper()
	ap := &agentProc{log: &syncBuffer{}}
	for i, a := range args {
		if a == "--admin" {
			ap.admin = args[i+1]
		}
	}
	ap.cmd = exec.Command(egretBinary(t), append([]string{"agent"}, args...)...)
	ap.cmd.Stdout, ap.cmd.Stderr = ap.log, ap.log
	if err := ap.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ap.cmd.ProcessState == nil {
			ap.cmd.Process.Kill()
			ap.cmd.Wait()
		}
	})
	return ap
}

// waitRunning polls the agent's admin API until the pod runs.
func (ap *agentProc) waitRunning(t *testing.T, pod string) time.Duration {
	t.Helper()
	start := time.Now()
	c := agent.AdminClient(ap.admin)
	defer c.CloseIdleConnections()
	running := false
	// Polls another process's admin API, which announces nothing; an
	// agent that exited ends the wait.
	testenv.Poll(15*time.Second, func() bool {
		resp, err := c.Get("http://egret/pods/" + pod)
		if err == nil {
			var st agent.PodStatus
			_ = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			running = st.State == agent.StateRunning
		}
		return running || ap.cmd.ProcessState != nil
	})
	if !running {
		t.Fatalf("agent not running pod %s; log:\n%s", pod, ap.log.String())
	}
	return time.Since(start)
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// agentProcessSetup makes a pod "web" with a ledger upstream, a pods file
// naming it, and the arguments for a real `egret agent` process serving it
// (extra arguments appended); everything is removed, and checked gone, at
// the end of the test.
func agentProcessSetup(t *testing.T) (p *pod, led *ledger.Server, up netip.AddrPort, podsFile string, args func(extra ...string) []string) {
	testenv.RequireRoot(t)
	name := Prefix + randHex(4)
	top := filepath.Join(cgroup2.Root(), name)
	pin := filepath.Join(bpfload.BPFFSRoot, name)
	t.Cleanup(func() {
		removeCgroupTree(t, top)
		assertNothingLeft(t, name, nil)
	})
	p = makePod(t, top, "web", podOpts{})
	led, up = startLedger(t, p.host4)
	dir := t.TempDir()
	podsFile = filepath.Join(dir, "pods.yaml")
	if err := os.WriteFile(podsFile, []byte(fmt.Sprintf("pods:\n  - name: web\n    cgroup: %s\n    netns: %s\n", p.cgroup, p.ns.Path())), 0o644); err != nil {
		t.Fatal(err)
	}
	args = func(extra ...string) []string {
		return append([]string{"--pods", podsFile, "--pin-dir", pin, "--cgroup", filepath.Join(top, "egret"),
			"--admin", filepath.Join(dir, "admin.sock")}, extra...)
	}
	return p, led, up, podsFile, args
}

func TestKill9FailsOpenAndRestartResumes(t *testing.T) {
	p, led, up, podsFile, args := agentProcessSetup(t)
	a1 := startAgent(t, args()...)
	a1.waitRunning(t, "web")
	if r := p.curl(t, url(up, "/")); r.Headers.Get("Egret-Request-Id") == "" {
		t.Fatalf("not redirected before the kill: %+v", r)
	}

	// A client in the pod opening a new connection per request, all along;
	// each phase lasts until the load shows it.
	t0 := time.Now()
	load := p.startLoad(t, url(up, "/load"))
	load.waitFor(t, "requests through the first agent", 50, func(s loadSample) bool { return s.Egret && s.Err == "" })
	tKill := time.Since(t0)
	if err := a1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a1.cmd.Wait()

	directSinceKill := func(s loadSample) bool { return s.Wall.Sub(t0) > tKill && !s.Egret && s.Err == "" }
	load.waitFor(t, "direct requests after the kill", 20, directSinceKill)
	// While the agent is down, a keep-alive connection made now goes
	// direct; it must survive the restart.
	ka := p.childCmd(t, "keepalive", request{URL: url(up, "/keepalive")})
	kaIn, _ := ka.StdinPipe()
	kaOut, _ := ka.StdoutPipe()
	if err := p.start(ka); err != nil {
		t.Fatal(err)
	}
	kaLines := bufio.NewScanner(kaOut)
	readKA := func() response {
		t.Helper()
		if !kaLines.Scan() {
			t.Fatalf("keepalive client: %v", kaLines.Err())
		}
		var r response
		_ = json.Unmarshal(kaLines.Bytes(), &r)
		return r
	}
	kaFirst := readKA()

	load.waitFor(t, "more direct requests while the agent is down", 50, directSinceKill)
	tRestart := time.Since(t0)
	metricsAddr := freeLoopbackAddr(t)
	a2 := startAgent(t, args("--cleanup", "--metrics", metricsAddr)...)
	ready := a2.waitRunning(t, "web")
	tReady := time.Since(t0)

	fmt.Fprintln(kaIn, "again")
	kaSecond := readKA()
	kaIn.Close()
	ka.Wait()

	load.waitFor(t, "requests through the second agent", 50, func(s loadSample) bool {
		return s.Wall.Sub(t0) > tReady+50*time.Millisecond && s.Egret
	})
	samples := load.stop(t)

	for i := range samples {
		samples[i].At = samples[i].Wall.Sub(t0)
	}
	// The pod's own view.
	var before, down, after, failed, connectFailed, viaEgretDown, directAfterReady int
	var window, worst time.Duration
	var windowStart time.Duration = -1
	for _, s := range samples {
		ok := s.Err == "" && s.Status == 200
		switch {
		case s.At+s.Took < tKill:
			before++
			if !ok || !s.Egret {
				t.Errorf("before the kill: %+v", s)
			}
		case s.At > tKill && s.At+s.Took < tRestart:
			down++
			if s.Egret {
				viaEgretDown++
			}
		case s.At > tReady+50*time.Millisecond:
			after++
			if !s.Egret {
				directAfterReady++
			}
		}
		if !ok {
			failed++
			if s.ConnectErr {
				connectFailed++
			}
			if windowStart < 0 {
				windowStart = s.At
			}
			window = s.At + s.Took - windowStart
		} else if windowStart >= 0 {
			worst = max(worst, window)
			windowStart = -1
		}
	}
	worst = max(worst, window)
	t.Logf("kill -9 at %v, restart at %v, ready %v later; %d requests (new connection each): %d before (egret), %d while down (%d through egret), %d after ready (%d direct)",
		tKill.Round(time.Millisecond), tRestart.Round(time.Millisecond), ready.Round(time.Millisecond),
		len(samples), before, down, viaEgretDown, after, directAfterReady)
	t.Logf("FAIL-OPEN WINDOW: %d failed requests (%d failed connects), longest run of failures %v", failed, connectFailed, worst)
	for _, s := range samples {
		if s.Err != "" || s.Status != 200 {
			t.Logf("  failed at %v: status %d err %s", s.At.Round(time.Millisecond), s.Status, s.Err)
		}
	}
	// A connect that reached the listener's queue just as the process
	// died is reset with it: that is the window, bounded to the moment of
	// the kill. Every other connect must work.
	for _, s := range samples {
		if s.ConnectErr && (s.At < tKill-100*time.Millisecond || s.At > tKill+100*time.Millisecond) {
			t.Errorf("connect failed at %v, away from the kill at %v: not fail-open", s.At, tKill)
		}
	}
	if failed > 3 {
		t.Errorf("%d requests failed", failed)
	}
	if down == 0 || viaEgretDown != 0 {
		t.Errorf("while the agent was down: %d requests, %d through egret", down, viaEgretDown)
	}
	if after == 0 || directAfterReady != 0 {
		t.Errorf("after restart: %d requests, %d direct", after, directAfterReady)
	}
	// Established connections survive the restart.
	if kaFirst.Status != 200 || kaFirst.Headers.Get("Egret-Request-Id") != "" {
		t.Errorf("keep-alive connection made while down: %+v", kaFirst)
	}
	if kaSecond.Err != "" || kaSecond.Status != 200 || !kaSecond.Reused {
		t.Errorf("keep-alive connection after the restart: %+v", kaSecond)
	}
	t.Logf("connection opened while the agent was down (%s) reused after the restart: status %d, reused %v",
		kaFirst.Local, kaSecond.Status, kaSecond.Reused)
	r := p.curl(t, "-H", "Ledger-Id: after-restart", "-H", "Ledger-Fault: 503; times=1", url(up, "/"))
	id := r.Headers.Get("Egret-Request-Id")
	if id == "" || attempts(r) != 2 {
		t.Fatalf("not redirected (and retried) after the restart: %+v", r)
	}
	// The agent's admin API explains it, and its metrics count the pod.
	var tv agent.TraceView
	adm := agent.AdminClient(a2.admin)
	defer adm.CloseIdleConnections()
	// Polls another process's admin API, which announces nothing.
	testenv.Poll(10*time.Second, func() bool {
		resp, err := adm.Get("http://egret/explain/" + id)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&tv)
			resp.Body.Close()
		}
		return err == nil && len(tv.Attempts) == 2
	})
	if len(tv.Attempts) != 2 || tv.Attempts[0].Status != 503 || tv.Attempts[0].Decision != "retry" || tv.Attempts[1].Status != 200 {
		t.Fatalf("explain %s: %+v", id, tv)
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(mb), `egret_agent_pods{state="running"} 1`) {
		t.Errorf("metrics lack the running pod:\n%s", mb)
	}
	t.Logf("explain %s over the admin socket: attempt 1 %d %s/%s, attempt 2 %d", id, tv.Attempts[0].Status,
		tv.Attempts[0].Decision, tv.Attempts[0].Reason, tv.Attempts[1].Status)
	// The same through the command line.
	out, err := exec.Command(egretBinary(t), "agent", "explain", "-o", "table", "--admin", a2.admin, id).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "attempt 2: status 200") {
		t.Fatalf("egret agent explain: %v\n%s", err, out)
	}
	t.Logf("$ egret agent explain %s\n%s", id, out)
	out, err = exec.Command(egretBinary(t), "agent", "pods", "--admin", a2.admin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"state": "running"`) {
		t.Fatalf("egret agent pods: %v\n%s", err, out)
	}
	if !strings.Contains(a2.log.String(), "adopted_pods=1") {
		t.Errorf("second agent did not adopt the pinned pod:\n%s", a2.log.String())
	}
	t.Logf("ledger: %d connections, %d executions", led.Stats().Connections, led.Stats().Executions)

	// The pods file changes while the agent runs: the pod goes, and its
	// connects go direct again.
	if err := os.WriteFile(podsFile+".new", []byte("pods: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(podsFile+".new", podsFile); err != nil {
		t.Fatal(err)
	}
	// Polls another process (its log and the pod's path), which
	// announces nothing.
	if !testenv.Poll(20*time.Second, func() bool {
		r := p.curl(t, url(up, "/"))
		return r.Headers.Get("Egret-Request-Id") == "" && strings.Contains(a2.log.String(), "pod removed")
	}) {
		t.Fatalf("pod not removed after the pods file changed:\n%s", a2.log.String())
	}

	// SIGTERM with --cleanup removes everything.
	a2.cmd.Process.Signal(syscall.SIGTERM)
	if err := a2.cmd.Wait(); err != nil {
		t.Errorf("agent exit: %v\n%s", err, a2.log.String())
	}
}
