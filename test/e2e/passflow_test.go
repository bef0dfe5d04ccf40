package e2e

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/internal/testkit/promtest"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
)

// What egret passes through is counted on the node as it ends, for the
// pod, witnessed on egret's own upstream socket (the agent's eBPF witness,
// TCP_INFO as its fallback): a pod's TLS connection (learning off, so
// that each comes to egret) with a server name the policy names, to a
// server that resets it once the client is done, is one reset after
// acknowledged bytes of "api.example.com:<port>"; a connection to a
// closed port is one refusal. Both show in the agent's summary and
// status beside the kernel's direct flows.
func TestPassthroughFlowsThroughAgent(t *testing.T) {
	// A TLS server (httptest's certificate) that, once the client has
	// closed its side, resets the connection.
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	ts.StartTLS()
	cert := ts.TLS.Certificates
	ts.Close()

	reg := prometheus.NewPedanticRegistry()
	pm, err := proxy.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	// The TLS server's port is chosen before the node starts, so that
	// the node's policy can name it; its address (the pod's host end)
	// is known once the pod is made.
	n := newNodeWithPolicy(t, pm, func(port int) string {
		return "upstreams:\n  - {host: api.example.com, port: " + strconv.Itoa(port) + "}\n"
	})
	p := n.node.addPod(t, "tlsweb", podOpts{spec: pods.Pod{Learn: pods.Learning{Off: true}}})
	ln, err := net.Listen("tcp", net.JoinHostPort(p.host4.String(), strconv.Itoa(n.port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	reset := make(chan struct{}, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := tls.Server(c, &tls.Config{Certificates: cert})
			if tc.Handshake() == nil {
				io.Copy(io.Discard, tc) // until the client's close
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			reset <- struct{}{}
		}
	}()
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	r := p.child(t, "tls", request{URL: "tcp://" + dst.String(), Headers: map[string]string{"Server-Name": "api.example.com"}})
	if r.Err != "" || !strings.HasPrefix(r.Local, "127.0.0.1:") {
		t.Fatalf("TLS connection: %+v (want it through egret)", r)
	}
	<-reset
	closed, err := net.Listen("tcp", net.JoinHostPort(p.host4.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	closedDst := closed.Addr().(*net.TCPAddr).AddrPort()
	closed.Close()
	if r := p.child(t, "echo", request{URL: "tcp://" + closedDst.String(), Body: "x"}); r.Err == "" {
		t.Fatalf("echo to a closed port through egret: %+v", r)
	}

	named := "api.example.com:" + strconv.Itoa(int(dst.Port()))
	count := func(labels ...string) float64 {
		return promtest.CounterSum(t, reg, "egret_proxy_passthrough_flows_total", append([]string{"source_pod", "tlsweb"}, labels...)...)
	}
	// The reset reaches egret's socket after the server's close; no
	// event tells the test when egret has read it.
	testenv.Eventually(t, 10*time.Second, "the reset counted", func() bool {
		return count("protocol", "tls", "destination", named, "outcome", "reset_after_ack", "evidence", "sent_no_response") == 1
	})
	for _, tc := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"protocol", "tls", "destination", named, "outcome", "established"}, 1},
		{[]string{"protocol", "tls", "outcome", "reset_before_ack"}, 0},
		{[]string{"outcome", "refused", "evidence", "not_sent", "destination", "other"}, 1},
		{[]string{"outcome", "connects"}, 2},
	} {
		if got := count(tc.labels...); got != tc.want {
			t.Errorf("%v = %v, want %v", tc.labels, got, tc.want)
		}
	}
	var rows []agent.DirectSummary
	for _, d := range n.node.agent.DirectSummaries() {
		if d.Path == agent.PathPassthrough && d.Pod == "tlsweb" {
			rows = append(rows, d)
		}
	}
	var connects, safe, ambiguous uint64
	for _, d := range rows {
		connects += d.Connects
		safe += d.SafeToRetry
		ambiguous += d.Ambiguous
	}
	if connects != 2 || safe != 1 || ambiguous != 1 {
		t.Errorf("summary rows %+v", rows)
	}
}

// policyNode is a node whose policy names a port chosen before it starts.
type policyNode struct {
	node *node
	port int
}

// newNodeWithPolicy starts a node with pm and the policy doc(port), port
// a free TCP port.
func newNodeWithPolicy(t *testing.T, pm *proxy.Metrics, doc func(port int) string) policyNode {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	pol, err := policy.Parse("p.yaml", []byte(doc(port)))
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, nodeOpts{proxy: proxy.Config{Policy: proxy.StaticPolicy{P: pol}, Shared: proxy.Shared{Metrics: pm}}})
	return policyNode{node: n, port: port}
}
