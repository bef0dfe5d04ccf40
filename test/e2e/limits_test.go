package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// holder is a pod's client that holds connections (silent or stalled
// uploads) until released.
type holder struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	rep heldReport
}

func (p *pod) hold(t *testing.T, mode string, req request) *holder {
	t.Helper()
	h := &holder{cmd: p.childCmd(t, mode, req)}
	h.in, _ = h.cmd.StdinPipe()
	out, _ := h.cmd.StdoutPipe()
	h.cmd.Stderr = os.Stderr
	if err := p.start(h.cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.release)
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		t.Fatalf("%s client said nothing: %v", mode, sc.Err())
	}
	if err := json.Unmarshal(sc.Bytes(), &h.rep); err != nil {
		t.Fatalf("%s client: %q: %v", mode, sc.Text(), err)
	}
	return h
}

// release closes the holder's connections.
func (h *holder) release() {
	if h.in != nil {
		h.in.Close()
		h.in = nil
		h.cmd.Wait()
	}
}

// loadResult is what loadFor's samples say: how many succeeded, how many of
// those through egret, and the first failures.
type loadResult struct {
	n, ok, viaEgret int
	fails           []string
}

func (r loadResult) String() string {
	return fmt.Sprintf("%d/%d ok (%.1f %%), %d through egret, %d direct", r.ok, r.n,
		100*float64(r.ok)/float64(max(r.n, 1)), r.viaEgret, r.ok-r.viaEgret)
}

// loadFor runs the load client in p for d and at least min requests (each on
// a new connection) and sums up its samples.
func (p *pod) loadFor(t *testing.T, u string, d time.Duration, min int) loadResult {
	t.Helper()
	cmd := p.childCmd(t, "load", request{URL: u, Duration: d, Min: min})
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := p.start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("load client: %v", err)
	}
	var samples []loadSample
	if err := json.Unmarshal(out.Bytes(), &samples); err != nil {
		t.Fatalf("load output: %v", err)
	}
	var r loadResult
	for _, s := range samples {
		r.n++
		if s.Err == "" && s.Status == 200 {
			r.ok++
			if s.Egret {
				r.viaEgret++
			}
		} else if len(r.fails) < 5 {
			r.fails = append(r.fails, fmt.Sprintf("%d %s (connect error %v, after %v)", s.Status, s.Err, s.ConnectErr, s.Took))
		}
	}
	return r
}

// TestPodAtItsLimitLeavesOthersAlone is the starvation attack, on a real
// agent process started with 256 descriptors (its hard limit 512, to which
// it raises itself) and two pods with real
// cgroups and namespaces: pod A opens 400 silent connections, then stalls
// 30 uploads of 8 MiB; pod B, all the while, runs requests on new
// connections. Before, A's silent connections made every request of B time
// out. Now A gets clear answers at its own limits (its connects past its
// share reset at once, its uploads past its spool bytes 503 not-sent) and
// B's success rate is 100 %, all through egret. Then A is allowed more
// connections than the node has descriptors for: when egret runs out, it
// stops redirecting (B's new connects go direct, none hangs) until A lets
// go, and B comes back through egret.
func TestPodAtItsLimitLeavesOthersAlone(t *testing.T) {
	testenv.RequireRoot(t)
	name := Prefix + randHex(4)
	top := filepath.Join(cgroup2.Root(), name)
	pin := filepath.Join(bpfload.BPFFSRoot, name)
	t.Cleanup(func() {
		removeCgroupTree(t, top)
		assertNothingLeft(t, name, nil)
	})
	a := makePod(t, top, "a", podOpts{})
	b := makePod(t, top, "b", podOpts{})
	_, upA := startLedger(t, a.host4)
	_, upB := startLedger(t, b.host4)
	dir := t.TempDir()
	podsFile := filepath.Join(dir, "pods.yaml")
	writePods := func(aLimits string) {
		doc := fmt.Sprintf("pods:\n  - name: a\n    cgroup: %s\n    netns: %s\n%s  - name: b\n    cgroup: %s\n    netns: %s\n",
			a.cgroup, a.ns.Path(), aLimits, b.cgroup, b.ns.Path())
		tmp := podsFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, podsFile); err != nil {
			t.Fatal(err)
		}
	}
	writePods("")
	admin := filepath.Join(dir, "admin.sock")
	ap := &agentProc{log: &syncBuffer{}, admin: admin}
	ap.cmd = exec.Command("prlimit", "--nofile=256:512", "--", egretBinary(t), "agent", "--pods", podsFile,
		"--pin-dir", pin, "--cgroup", filepath.Join(top, "egret"), "--admin", admin, "--cleanup")
	ap.cmd.Stdout, ap.cmd.Stderr = ap.log, ap.log
	if err := ap.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			ap.cmd.Process.Signal(syscall.SIGTERM)
			ap.cmd.Wait()
		}
	}
	t.Cleanup(stop)
	ap.waitRunning(t, "a")
	ap.waitRunning(t, "b")
	stA := podStatus(t, admin, "a")
	if stA.Limits == nil || stA.Limits.Conns != 48 || stA.Limits.InFlight != 256 || stA.Limits.SpoolBytes != 64<<20 {
		t.Fatalf("pod a's default limits %+v; want 48 connections (a quarter of (512-128)/2), 256 in flight, 64 MiB", stA.Limits)
	}
	if !strings.Contains(ap.log.String(), "limit=512 for_pods=384 pod_connections=48") {
		t.Errorf("the agent did not raise its soft limit to 512 or does not say its descriptor limits:\n%s", ap.log)
	}
	if r := b.curl(t, url(upB, "/")); r.Headers.Get("Egret-Request-Id") == "" {
		t.Fatalf("pod b not through egret: %+v", r)
	}

	// 1. A opens 400 silent connections.
	silent := a.hold(t, "silent", request{URL: url(upA, "/"), Count: 400, Admin: admin, Pod: "a"})
	t.Logf("pod a, 400 silent connections at its default limit: %+v", silent.rep)
	if silent.rep.Unsettled || silent.rep.Held+silent.rep.Reset+silent.rep.DialErrs != 400 || silent.rep.Held != 48 {
		t.Errorf("pod a: %+v; want its 48 held, the rest refused", silent.rep)
	}
	res := b.loadFor(t, url(upB, "/b"), 3*time.Second, 50)
	t.Logf("pod b while a holds its connections: %s", res)
	if res.n < 50 || res.ok != res.n || res.viaEgret != res.n {
		t.Errorf("pod b: %s; failures %v", res, res.fails)
	}
	silent.release()

	// 2. A stalls 30 uploads of 8 MiB (each held in a spool file).
	stall := a.hold(t, "stall", request{URL: url(upA, "/"), Count: 30, Size: 8 << 20, Admin: admin, Pod: "a"})
	t.Logf("pod a, 30 stalled 8 MiB uploads: %+v", stall.rep)
	if stall.rep.Unsettled || stall.rep.Held != 8 || stall.rep.Answers["503 not-sent"] != 22 {
		t.Errorf("pod a's uploads: %+v; want 8 held (64 MiB) and 22 answered 503 not-sent", stall.rep)
	}
	st := podStatus(t, admin, "a")
	if st.Usage == nil || st.Usage.SpoolBytes != 64<<20 {
		t.Errorf("pod a's usage %+v, want 64 MiB of spool held", st.Usage)
	}
	res = b.loadFor(t, url(upB, "/b"), 2*time.Second, 50)
	t.Logf("pod b while a stalls its uploads: %s", res)
	if res.n < 50 || res.ok != res.n || res.viaEgret != res.n {
		t.Errorf("pod b: %s; failures %v", res, res.fails)
	}
	stall.release()

	// 3. A may open more connections than egret has descriptors for.
	writePods("    limits:\n      connections: 1000\n")
	waitUntil(t, "pod a's new limit", func() bool { st := podStatus(t, admin, "a"); return st.Limits != nil && st.Limits.Conns == 1000 })
	// Past egret's descriptors, its listeners leave the kernel's config and
	// A's later connects go direct: no count of the agent's settles them,
	// so the report says only what was dialed, and the log says when egret
	// ran out.
	flood := a.hold(t, "silent", request{URL: url(upA, "/"), Count: 400})
	t.Logf("pod a, 400 silent connections with a limit of 1000: %+v", flood.rep)
	waitUntil(t, "egret out of descriptors (log: out of file descriptors for pods)", func() bool {
		return strings.Contains(ap.log.String(), "out of file descriptors for pods")
	})
	// 2 s and at least 50 requests: a loaded CI machine made 33 in 2 s
	// here (each on a new connection, past a flooded agent), so the load
	// runs on until it has them.
	res = b.loadFor(t, url(upB, "/b"), 2*time.Second, 50)
	t.Logf("pod b while egret is out of descriptors: %s", res)
	if res.n < 50 || res.ok != res.n || res.viaEgret == res.n {
		t.Errorf("pod b: %s; want every request answered, direct while egret has no room; failures %v", res, res.fails)
	}
	flood.release()
	waitUntil(t, "descriptors back", func() bool { return strings.Contains(ap.log.String(), "file descriptors back") })
	res = b.loadFor(t, url(upB, "/b"), time.Second, 20)
	t.Logf("pod b after a let go: %s", res)
	if res.n < 20 || res.ok != res.n || res.viaEgret != res.n {
		t.Errorf("pod b after: %s; failures %v", res, res.fails)
	}
	if st := podStatus(t, admin, "b"); st.Usage == nil || len(st.Usage.Refused) != 0 {
		t.Errorf("pod b was refused something: %+v", st.Usage)
	}
	stop()
	if strings.Contains(ap.log.String(), "too many open files") {
		t.Errorf("egret itself ran out of descriptors: its reserve did not hold")
	}
	if t.Failed() {
		t.Logf("agent log:\n%s", ap.log)
	}
}

// waitUntil waits up to 10 s for cond (a test's view of another process:
// its log, its admin API; neither tells of a change).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what, cond)
}
