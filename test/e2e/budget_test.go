package e2e

import (
	"fmt"
	"testing"

	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
)

// TestBudgetsAreNodeWideAndPodPolicyApplies: the retry budget of an
// upstream is one for the node, whichever pod spends it; a pod's policy
// override applies to that pod only.
func TestBudgetsAreNodeWideAndPodPolicyApplies(t *testing.T) {
	// Two retry tokens per 10 s window for any upstream, none earned.
	pol, err := policy.Parse("node.yaml", []byte("defaults:\n  budget:\n    ratio: 0\n    min_per_second: 0.2\n    ttl: 10s\n"))
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, nodeOpts{proxy: proxy.Config{Policy: proxy.StaticPolicy{P: pol}}})
	a := n.addPod(t, "pod-a", podOpts{})
	b := n.addPod(t, "pod-b", podOpts{})
	c := n.addPod(t, "pod-c", podOpts{spec: pods.Pod{Policy: []byte("defaults:\n  max_attempts: 1\n")}})
	// One upstream for all: the ledger on pod a's host end, reachable from
	// every pod through the host.
	led, up := startLedger(t, a.host4)

	get := func(p *pod, id string) response {
		t.Helper()
		return p.curl(t, "-H", "Ledger-Id: "+id, "-H", "Ledger-Fault: 503; times=1", url(up, "/"))
	}
	// Pod c's own policy: no retries at all.
	if r := get(c, "c-1"); r.Status != 503 || attempts(r) != 1 {
		t.Fatalf("pod c (max_attempts 1): status %d attempts %d", r.Status, attempts(r))
	}
	// Pod a spends the node's two tokens for this upstream...
	for i := range 2 {
		if r := get(a, fmt.Sprintf("a-%d", i)); r.Status != 200 || attempts(r) != 2 {
			t.Fatalf("pod a request %d: status %d attempts %d", i, r.Status, attempts(r))
		}
	}
	// ...so pod b's retry is refused by the same budget.
	r := get(b, "b-1")
	if r.Status != 503 || attempts(r) != 1 {
		t.Fatalf("pod b after pod a spent the budget: status %d attempts %d", r.Status, attempts(r))
	}
	tr, _ := n.trace(r.Headers.Get("Egret-Request-Id"))
	if len(tr.Attempts) != 1 || tr.Attempts[0].Decision.Reason.String() != "budget_exhausted" {
		t.Fatalf("pod b's decision: %+v", tr.Attempts)
	}
	ups := n.agent.Upstreams()
	t.Logf("node-wide budget %v: pod a retried twice, pod b denied (%s); pod c's override max_attempts 1 kept it from retrying; ledger executions a:%d b:%d c:%d",
		ups, tr.Attempts[0].Decision.Reason, led.Executions("a-0"), led.Executions("b-1"), led.Executions("c-1"))
}
