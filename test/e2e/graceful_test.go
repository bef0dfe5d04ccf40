package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestGracefulRestartLosesNothing: SIGTERM closes the listeners first (new
// connects go direct at once), lets in-flight requests finish, and leaves
// the pinned state; the next agent adopts it. Under load, no request fails.
func TestGracefulRestartLosesNothing(t *testing.T) {
	p, _, up, _, args := agentProcessSetup(t)
	a1 := startAgent(t, args()...)
	a1.waitRunning(t, "web")

	load := p.childCmd(t, "load", request{URL: url(up, "/load"), Duration: 4 * time.Second})
	var out bytes.Buffer
	load.Stdout, load.Stderr = &out, os.Stderr
	t0 := time.Now()
	if err := p.start(load); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	tStop := time.Since(t0)
	a1.cmd.Process.Signal(syscall.SIGTERM)
	if err := a1.cmd.Wait(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v\n%s", err, a1.log.String())
	}
	tStopped := time.Since(t0)
	time.Sleep(800 * time.Millisecond)
	a2 := startAgent(t, args("--cleanup")...)
	a2.waitRunning(t, "web")
	tReady := time.Since(t0)
	if err := load.Wait(); err != nil {
		t.Fatal(err)
	}
	var samples []loadSample
	if err := json.Unmarshal(out.Bytes(), &samples); err != nil {
		t.Fatal(err)
	}
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
