package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// loadStream is a load client in a pod that reports each request as it
// ends, so that a test moves on when the load shows what it waits for (so
// many requests through egret, so many direct) rather than after a time
// that a loaded machine may not honour.
type loadStream struct {
	cmd     *exec.Cmd
	in      io.WriteCloser
	samples chan loadSample // closed when the client's output ends
	all     []loadSample    // every sample consumed so far
}

// loadWait bounds how long a loadStream wait may take: a failure deadline,
// not synchronisation.
const loadWait = time.Minute

func (p *pod) startLoad(t *testing.T, url string) *loadStream {
	t.Helper()
	l := &loadStream{cmd: p.childCmd(t, "loadstream", request{URL: url}), samples: make(chan loadSample, 1<<16)}
	l.in, _ = l.cmd.StdinPipe()
	out, _ := l.cmd.StdoutPipe()
	l.cmd.Stderr = os.Stderr
	if err := p.start(l.cmd); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(l.samples)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var s loadSample
			if json.Unmarshal(sc.Bytes(), &s) == nil {
				l.samples <- s
			}
		}
	}()
	t.Cleanup(func() { l.stop(t) })
	return l
}

// waitFor consumes samples until n of them satisfy cond.
func (l *loadStream) waitFor(t *testing.T, what string, n int, cond func(loadSample) bool) {
	t.Helper()
	deadline := time.After(loadWait)
	for got := 0; got < n; {
		select {
		case s, ok := <-l.samples:
			if !ok {
				t.Fatalf("the load client ended before %s (%d of %d)", what, got, n)
			}
			l.all = append(l.all, s)
			if cond(s) {
				got++
			}
		case <-deadline:
			t.Fatalf("%s: %d of %d samples in %v", what, got, n, loadWait)
		}
	}
}

// stop ends the load and returns every sample.
func (l *loadStream) stop(t *testing.T) []loadSample {
	if l.in != nil {
		l.in.Close()
		l.in = nil
		for s := range l.samples {
			l.all = append(l.all, s)
		}
		if err := l.cmd.Wait(); err != nil {
			t.Errorf("load client: %v", err)
		}
	}
	return l.all
}

// TestGracefulRestartLosesNothing: SIGTERM closes the listeners first (new
// connects go direct at once), lets in-flight requests finish, and leaves
// the pinned state; the next agent adopts it. Under load, no request fails.
// Each phase lasts until the load shows it: requests through the first
// agent, then direct ones after it stopped, then through the second.
func TestGracefulRestartLosesNothing(t *testing.T) {
	p, _, up, _, args := agentProcessSetup(t)
	a1 := startAgent(t, args()...)
	a1.waitRunning(t, "web")

	t0 := time.Now()
	load := p.startLoad(t, url(up, "/load"))
	load.waitFor(t, "requests through the first agent", 50, func(s loadSample) bool { return s.Egret && s.Err == "" })
	tStop := time.Since(t0)
	a1.cmd.Process.Signal(syscall.SIGTERM)
	if err := a1.cmd.Wait(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v\n%s", err, a1.log.String())
	}
	tStopped := time.Since(t0)
	load.waitFor(t, "direct requests while no agent runs", 50, func(s loadSample) bool {
		return s.Wall.Sub(t0) > tStopped && !s.Egret && s.Err == ""
	})
	a2 := startAgent(t, args("--cleanup")...)
	a2.waitRunning(t, "web")
	tReady := time.Since(t0)
	load.waitFor(t, "requests through the second agent", 50, func(s loadSample) bool {
		return s.Wall.Sub(t0) > tReady && s.Egret
	})
	samples := load.stop(t)
	var failed, direct, before, after int
	for _, s := range samples {
		at := s.Wall.Sub(t0)
		if s.Err != "" || s.Status != 200 {
			failed++
			t.Logf("failed at %v: %d %s", at, s.Status, s.Err)
		}
		switch {
		case at+s.Took < tStop:
			before++
		case at > tStopped && at+s.Took < tReady:
			if !s.Egret {
				direct++
			}
		case at > tReady+50*time.Millisecond:
			if s.Egret {
				after++
			} else {
				t.Errorf("direct after the restart at %v", at)
			}
		}
	}
	t.Logf("graceful restart under load: %d requests, %d failed; SIGTERM at %v, agent gone %v later; %d direct while down, %d through egret after the restart",
		len(samples), failed, tStop.Round(time.Millisecond), (tStopped - tStop).Round(time.Millisecond), direct, after)
	if failed != 0 || before == 0 || direct == 0 || after == 0 {
		t.Fatalf("failed %d before %d direct %d after %d", failed, before, direct, after)
	}
	a2.cmd.Process.Signal(syscall.SIGTERM)
	if err := a2.cmd.Wait(); err != nil {
		t.Errorf("agent exit: %v", err)
	}
}
