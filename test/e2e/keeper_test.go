package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
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

// startKeeper runs `egret keeper` on a socket in dir until the test ends.
// It keeps a dead agent's listeners until the next agent comes (--hold
// 0): the next agent's arrival is what the test waits for, not a race
// between its start and the default 3 s hold, which a loaded machine
// loses (under -race at a load average of 30-50 the next agent came
// 0.07-9.8 s after the hold ended, in 8 of 15 rounds). The held client's
// own 20 s timeout bounds the wait.
func startKeeper(t *testing.T, sock string) {
	t.Helper()
	log := &syncBuffer{}
	cmd := exec.Command(egretBinary(t), "keeper", "--socket", sock, "--hold", "0")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("keeper exit: %v\n%s", err, log.String())
		}
		if t.Failed() {
			t.Logf("keeper log:\n%s", log.String())
		}
	})
}

// TestKill9WithKeeperServesQueuedConnect: with `egret keeper` beside it,
// an agent SIGKILLed with a connect queued on a pod's listener loses
// nothing. Each of 5 rounds freezes the agent (SIGSTOP) so that a client
// in the pod connects and is queued, unaccepted, on the listener; kills
// it; lets the client send its request; and starts a new agent in a new
// cgroup (the old one removed, as a container's is), which gets the
// listener back from the keeper, adopts it and answers that request
// through egret (the original destination found by OriginalDstOf: the
// old cgroup's getsockopt is gone). All along another client in the pod
// opens a new connection per request: no connect fails and no request
// hangs; only a request the killed agent was serving may fail.
func TestKill9WithKeeperServesQueuedConnect(t *testing.T) {
	testenv.RequireRoot(t)
	name := Prefix + randHex(4)
	top := filepath.Join(cgroup2.Root(), name)
	pin := filepath.Join(bpfload.BPFFSRoot, name)
	t.Cleanup(func() {
		removeCgroupTree(t, top)
		assertNothingLeft(t, name, nil)
	})
	p := makePod(t, top, "web", podOpts{})
	_, up := startLedger(t, p.host4)
	dir := t.TempDir()
	podsFile := filepath.Join(dir, "pods.yaml")
	if err := os.WriteFile(podsFile, []byte(fmt.Sprintf("pods:\n  - name: web\n    cgroup: %s\n    netns: %s\n", p.cgroup, p.ns.Path())), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "keeper.sock")
	startKeeper(t, sock)
	agentIn := func(n int) (*agentProc, string) {
		cg := filepath.Join(top, fmt.Sprintf("egret-%d", n))
		return startAgent(t, "--pods", podsFile, "--pin-dir", pin, "--cgroup", cg,
			"--admin", filepath.Join(dir, "admin.sock"), "--keeper", sock, "--cleanup"), cg
	}
	a, cg := agentIn(0)
	a.waitRunning(t, "web")

	// A connect made while the agent is frozen or dead waits for the next
	// one: under CPU load that took up to 6.2 s, past a 5 s timeout. A
	// request is counted hung at 30 s, when nothing came for it.
	const hangs = 30 * time.Second
	load := p.childCmd(t, "load", request{URL: url(up, "/load"), Timeout: hangs})
	loadIn, _ := load.StdinPipe()
	var loadOut bytes.Buffer
	load.Stdout, load.Stderr = &loadOut, os.Stderr
	if err := p.start(load); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if load.ProcessState == nil {
			load.Process.Kill()
			load.Wait()
		}
	})

	const rounds = 5
	served := 0
	var kills []time.Time
	for round := 1; round <= rounds; round++ {
		// Frozen, the agent accepts nothing: the kernel queues the next
		// connect on its listener.
		if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		held := p.childCmd(t, "held", request{URL: url(up, fmt.Sprintf("/queued-%d", round)),
			Headers: map[string]string{"Ledger-Id": fmt.Sprintf("queued-%d", round)}})
		heldIn, _ := held.StdinPipe()
		heldOut, _ := held.StdoutPipe()
		if err := p.start(held); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(heldOut)
		var conn response
		if !lines.Scan() || json.Unmarshal(lines.Bytes(), &conn) != nil || conn.Err != "" {
			t.Fatalf("round %d: the held client did not connect: %q %v", round, lines.Text(), lines.Err())
		}
		kills = append(kills, time.Now())
		if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		a.cmd.Wait()
		// The container's cgroup goes with it.
		if err := os.Remove(cg); err != nil {
			t.Fatal(err)
		}
		// The request goes out on the queued connection while no agent
		// runs: it waits in the socket, kept by the keeper.
		fmt.Fprintln(heldIn, "go")
		// Meanwhile a new connect goes direct: no agent runs (its
		// liveness socket went with it), though its listener lives on.
		if r := p.goClient(t, request{URL: url(up, "/gap")}); r.Status != 200 || r.Headers.Get("Egret-Request-Id") != "" {
			t.Errorf("round %d: a connect while no agent ran: %+v, want 200 direct", round, r)
		}
		start := time.Now()
		a, cg = agentIn(round)
		a.waitRunning(t, "web")
		var r response
		if !lines.Scan() || json.Unmarshal(lines.Bytes(), &r) != nil {
			t.Fatalf("round %d: no answer on the queued connection: %q %v\nagent log:\n%s", round, lines.Text(), lines.Err(), a.log.String())
		}
		heldIn.Close()
		held.Wait()
		if r.Err != "" || r.Status != 200 || r.Headers.Get("Egret-Request-Id") == "" {
			t.Errorf("round %d: the connect queued at the kill was not served through egret by the next agent: %+v\nagent log:\n%s", round, r, a.log.String())
		} else {
			served++
		}
		// And new connects come to egret again.
		if r := p.goClient(t, request{URL: url(up, "/after")}); r.Status != 200 || r.Headers.Get("Egret-Request-Id") == "" {
			t.Errorf("round %d: a connect after the restart: %+v, want 200 through egret", round, r)
		}
		t.Logf("round %d: queued connect (from %s) answered %d through egret, %v after the kill",
			round, conn.Local, r.Status, time.Since(start).Round(time.Millisecond))
	}

	loadIn.Close()
	if err := load.Wait(); err != nil {
		t.Fatalf("load client: %v", err)
	}
	var samples []loadSample
	if err := json.Unmarshal(loadOut.Bytes(), &samples); err != nil {
		t.Fatalf("load output: %v", err)
	}
	var viaEgret, direct, connectFailed, hung, failed int
	var slowest time.Duration
	for _, s := range samples {
		slowest = max(slowest, s.Took)
		switch {
		case s.ConnectErr:
			connectFailed++
		case s.Took >= hangs || strings.Contains(s.Err, "Client.Timeout"):
			hung++
		case s.Err != "" || s.Status != 200:
			failed++
		case s.Egret:
			viaEgret++
		default:
			direct++
		}
		if s.Err != "" || s.Status != 200 {
			t.Logf("  failed at %s: status %d err %s (took %v)", s.Wall.Format("15:04:05.000"), s.Status, s.Err, s.Took.Round(time.Millisecond))
		}
	}
	t.Logf("KEEPER: %d/%d connects queued at a SIGKILL served by the next agent; looping client: %d requests (%d through egret, %d direct while no agent ran), %d failed connects, %d hung, %d failed in flight at a kill; slowest %v",
		served, rounds, len(samples), viaEgret, direct, connectFailed, hung, failed, slowest.Round(time.Millisecond))
	if served != rounds {
		t.Errorf("%d of %d queued connects served, want all", served, rounds)
	}
	if connectFailed != 0 || hung != 0 {
		t.Errorf("%d failed connects, %d hung requests: want 0", connectFailed, hung)
	}
	// What the agent held at a kill, it loses: at most one request each.
	if failed > rounds {
		t.Errorf("%d requests failed in %d kills", failed, rounds)
	}
	if viaEgret == 0 {
		t.Errorf("no request of the looping client went through egret")
	}

	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.cmd.Wait(); err != nil {
		t.Errorf("agent exit: %v\n%s", err, a.log.String())
	}
}
