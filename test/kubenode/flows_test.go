package kubenode_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/egret-proxy/egret/test/kubenode"
)

// TestDirectFlowsOnNode: what egret leaves direct it still counts, on the
// real node. An opted-in pod connects to a closed port among egret's
// default direct ports (PostgreSQL's 5432: the connect never reaches
// egret); the kernel's answer, a refusal, is counted for that pod and
// path as a failure a retry could have fixed safely, in the agent's
// /metrics as DaemonSet-installed Prometheus would scrape it.
func TestDirectFlowsOnNode(t *testing.T) {
	c := startCluster(t, "egret-flows", false)
	n := c.n
	c.installEgret(t)
	c.newPod(t, "client", []string{"pause"}, optIn)
	t.Cleanup(func() { c.deletePod(t, "client") })
	c.n.WaitPod(t, c.ns, "client", 2*time.Minute, "Ready", kubenode.PodReady)
	c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/client")

	// The port is closed on the node's address: the node answers the SYN
	// with a reset.
	closed := kubenode.IP + ":5432"
	n.Listen(t, closed).Close() // free, then closed
	const tries = 3
	before := c.directFlows(t, "refused")
	for range tries {
		out, err := c.n.KubectlErr("exec", "-n", c.ns, "client", "-c", "c", "--", "/testbin", "get", "http://"+closed+"/")
		if err == nil || !strings.Contains(out, "connection refused") {
			t.Fatalf("GET %s from the pod: %v: %s; want the kernel's refusal (the port goes direct)", closed, err, out)
		}
	}
	after := c.directFlows(t, "refused")
	if got := after - before; got != tries {
		t.Errorf("egret_agent_direct_flows_total{pod=client,path=direct_port,outcome=refused,evidence=not_sent} grew by %v, want %d", got, tries)
	}
	t.Logf("%d refused connects of the pod to %s (a default direct port): the agent's metric grew %v -> %v", tries, closed, before, after)
}

// TestPassthroughFlowsOnNode: what egret passes through it counts too,
// on the real node, and what it then learned direct the kernel counts.
// An opted-in pod's TLS handshakes (server name api.example.com) to a
// closed port: the first comes to egret, is sniffed as TLS, learned, and
// egret's dial is refused (one passthrough flow refused, not_sent, for
// that pod); the next go direct and the kernel refuses them (learned
// direct refusals), all in the agent's /metrics.
func TestPassthroughFlowsOnNode(t *testing.T) {
	c := startCluster(t, "egret-ptflows", false)
	c.installEgret(t)
	c.newPod(t, "client", []string{"pause"}, optIn)
	t.Cleanup(func() { c.deletePod(t, "client") })
	c.n.WaitPod(t, c.ns, "client", 2*time.Minute, "Ready", kubenode.PodReady)
	c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/client")

	closed := kubenode.IP + ":9443"
	c.n.Listen(t, closed).Close()
	pt := map[string]string{"source_namespace": c.ns, "source_pod": "client", "protocol": "tls", "outcome": "refused", "evidence": "not_sent"}
	ld := map[string]string{"namespace": c.ns, "pod": "client", "path": "learned_direct", "outcome": "refused", "evidence": "not_sent"}
	ptBefore, ldBefore := c.metricSum(t, "egret_proxy_passthrough_flows_total", pt), c.metricSum(t, "egret_agent_direct_flows_total", ld)
	const tries = 3
	for range tries {
		out, err := c.n.KubectlErr("exec", "-n", c.ns, "client", "-c", "c", "--", "/testbin", "tls", "-sni", "api.example.com", closed)
		if err == nil {
			t.Fatalf("TLS to %s from the pod succeeded: %s", closed, out)
		}
	}
	ptGot := c.metricSum(t, "egret_proxy_passthrough_flows_total", pt) - ptBefore
	ldGot := c.metricSum(t, "egret_agent_direct_flows_total", ld) - ldBefore
	if ptGot != 1 || ldGot != tries-1 {
		t.Errorf("refusals: %v passed through by egret (want 1), %v learned direct (want %d)", ptGot, ldGot, tries-1)
	}
	t.Logf("%d TLS handshakes of the pod to %s: %v refused through egret, %v refused direct once learned", tries, closed, ptGot, ldGot)
}

// directFlows is the agent's count of the client pod's direct_port
// connects that ended in outcome with the evidence not_sent (0 before the
// first).
func (c *cluster) directFlows(t testing.TB, outcome string) float64 {
	t.Helper()
	return c.metricSum(t, "egret_agent_direct_flows_total",
		map[string]string{"namespace": c.ns, "pod": "client", "path": "direct_port", "outcome": outcome, "evidence": "not_sent"})
}

// metricSum sums the series of the agent's family whose labels include
// want (0 when none).
func (c *cluster) metricSum(t testing.TB, family string, want map[string]string) float64 {
	t.Helper()
	body := c.agentMetrics(t)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	sum := 0.0
	for _, m := range fams[family].GetMetric() {
		match := 0
		for _, lp := range m.GetLabel() {
			if v, ok := want[lp.GetName()]; ok && v == lp.GetValue() {
				match++
			}
		}
		if match == len(want) {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
