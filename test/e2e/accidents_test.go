package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// metricValue reads one sample of /metrics (-1 if absent).
func metricValue(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// TestAgentRefusesConfigAccidents: a real agent with two pods, a policy file
// and a pods file, each then broken the way an operator's mistake or a
// half-written file breaks it. An empty or comment-only policy, or a policy
// path that became a directory, is refused, logged and counted
// (egret_policy_last_reload_successful 0), and the pods keep the running
// policy (max_attempts 2, not the defaults' 3). A pods file naming one
// cgroup for two pods, or the cgroup v2 root for one, is refused with its
// line; both pods keep running and redirected.
func TestAgentRefusesConfigAccidents(t *testing.T) {
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
	podsFile, policyFile := filepath.Join(dir, "pods.yaml"), filepath.Join(dir, "policy.yaml")
	write := func(path, doc string) {
		t.Helper()
		os.RemoveAll(path)
		if err := os.WriteFile(path+".tmp", []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	pods := func(bCgroup string) string {
		return fmt.Sprintf("pods:\n  - name: a\n    cgroup: %s\n    netns: %s\n  - name: b\n    cgroup: %s\n    netns: %s\n",
			a.cgroup, a.ns.Path(), bCgroup, b.ns.Path())
	}
	write(podsFile, pods(b.cgroup))
	write(policyFile, "defaults:\n  max_attempts: 2\n  backoff: {kind: full, base: 1ms, max: 5ms}\n")
	metrics := freeLoopbackAddr(t)
	admin := filepath.Join(dir, "admin.sock")
	ap := startAgent(t, "--pods", podsFile, "--policy", policyFile, "--pin-dir", pin, "--cgroup", filepath.Join(top, "egret"),
		"--admin", admin, "--metrics", metrics, "--cleanup")
	t.Cleanup(func() { // --cleanup: the pins go with a graceful stop
		ap.cmd.Process.Signal(syscall.SIGTERM)
		ap.cmd.Wait()
	})
	ap.waitRunning(t, "a")
	ap.waitRunning(t, "b")
	attemptsNow := func(p *pod, up string, id string) int {
		r := p.curl(t, "-H", "Ledger-Id: "+id, "-H", "Ledger-Fault: 503; times=5", up)
		return attempts(r)
	}
	if n := attemptsNow(a, url(upA, "/"), "acc-0"); n != 2 {
		t.Fatalf("policy not in force: %d attempts", n)
	}
	failures := 0.0
	for i, doc := range []string{"", "# being rewritten\n"} {
		write(policyFile, doc)
		failures++
		waitUntil(t, fmt.Sprintf("policy %q refused", doc), func() bool {
			return metricValue(t, metrics, `egret_policy_reloads_total{result="failure"}`) == failures
		})
		if v := metricValue(t, metrics, "egret_policy_last_reload_successful"); v != 0 {
			t.Errorf("%q: last_reload_successful %v", doc, v)
		}
		for _, p := range []struct {
			p  *pod
			up string
		}{{a, url(upA, "/")}, {b, url(upB, "/")}} {
			if n := attemptsNow(p.p, p.up, fmt.Sprintf("acc-%d-%s", i, p.p.name)); n != 2 {
				t.Errorf("after %q, pod %s: %d attempts; the running policy (2) must stay", doc, p.p.name, n)
			}
		}
		// A good file between the two, so the second refusal is new.
		write(policyFile, "defaults:\n  max_attempts: 2\n  backoff: {kind: full, base: 1ms, max: 5ms}\n# "+strconv.Itoa(i)+"\n")
		waitUntil(t, "the good policy back", func() bool {
			return metricValue(t, metrics, "egret_policy_last_reload_successful") == 1
		})
	}
	if !strings.Contains(ap.log.String(), "no policy in the file") {
		t.Errorf("the agent's log does not say why the empty policy was refused:\n%s", ap.log)
	}
	if err := os.Remove(policyFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(policyFile, 0o755); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the directory refused", func() bool { return strings.Contains(ap.log.String(), "is a directory") })
	if v := metricValue(t, metrics, "egret_policy_last_reload_successful"); v != 0 {
		t.Errorf("directory: last_reload_successful %v", v)
	}
	if n := attemptsNow(a, url(upA, "/"), "acc-dir"); n != 2 {
		t.Errorf("after the directory: %d attempts", n)
	}

	// Pods file accidents.
	for _, c := range []struct{ bCgroup, says string }{
		{a.cgroup, "is already pod a's (line 3): one cgroup per pod"},
		{".", "is the cgroup v2 root"},
		{cgroup2.Root(), "is the cgroup v2 root"},
	} {
		before := strings.Count(ap.log.String(), "pod source refused")
		write(podsFile, pods(c.bCgroup))
		waitUntil(t, "the pods file refused", func() bool {
			return strings.Count(ap.log.String(), "pod source refused") > before
		})
		if !strings.Contains(ap.log.String(), c.says) {
			t.Errorf("cgroup %s for pod b: the log does not say %q:\n%s", c.bCgroup, c.says, ap.log)
		}
		for _, p := range []*pod{a, b} {
			if st := podStatus(t, admin, p.name); st.State != agent.StateRunning || st.Cgroup != p.cgroup {
				t.Errorf("after cgroup %s for b: pod %s is %+v", c.bCgroup, p.name, st)
			}
		}
		if r := b.curl(t, url(upB, "/")); r.Headers.Get("Egret-Request-Id") == "" {
			t.Errorf("after cgroup %s for b: pod b no longer through egret", c.bCgroup)
		}
		write(podsFile, pods(b.cgroup)) // between two refusals
	}
}
