package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAgentSIGTERMPastGraceAnswersEveryRequest: 200 POSTs of a pod are in
// flight through a real `egret agent` process — each has reached the
// upstream, which holds its answer — when the agent gets SIGTERM with an
// exhausted --grace. Every one must get a truthful answer (502 ambiguous:
// it may have run) and its log line; before, 168 of 200 got a bare EOF and
// no line.
func TestAgentSIGTERMPastGraceAnswersEveryRequest(t *testing.T) {
	const n = 200
	p, led, up, _, args := agentProcessSetup(t)
	ap := startAgent(t, args("--grace", "1ms", "--cleanup")...)
	ap.waitRunning(t, "web")
	burst := p.childCmd(t, "burst", request{Method: "POST", URL: url(up, "/pay"), Body: "pay=1", Count: n,
		Headers: map[string]string{"Ledger-Id": "burst-{i}", "Ledger-Fault": "hold; ms=30000"}})
	var out bytes.Buffer
	burst.Stdout, burst.Stderr = &out, os.Stderr
	if err := p.start(burst); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "200 requests executed upstream", func() bool {
		executed := 0
		for id, r := range led.Records() {
			if strings.HasPrefix(id, "burst-") && len(r.Executions) > 0 {
				executed++
			}
		}
		return executed == n
	})
	start := time.Now()
	ap.cmd.Process.Signal(syscall.SIGTERM)
	if err := burst.Wait(); err != nil {
		t.Fatal(err)
	}
	answered := time.Since(start)
	ap.cmd.Wait()
	var answers map[string]int
	if err := json.Unmarshal(out.Bytes(), &answers); err != nil {
		t.Fatalf("burst client: %q: %v", out.String(), err)
	}
	logged := strings.Count(ap.log.String(), "outcome=ambiguous")
	if answers["502 ambiguous"] != n || logged != n {
		t.Fatalf("answers %v, %d ambiguous log lines; want %d of each\n%s", answers, logged, n, ap.log)
	}
	t.Logf("SIGTERM past --grace with %d POSTs executed upstream: %s, %d logged, all answered %v after the signal",
		n, fmt.Sprint(answers), logged, answered.Round(time.Millisecond))
}
