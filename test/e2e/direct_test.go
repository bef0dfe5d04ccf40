package e2e

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/internal/testkit/promtest"
	"github.com/egret-proxy/egret/proxy"
)

// connects runs the "connects" client in the pod: n connects to dst, each
// writing a line at once; it returns how many ended which way.
func (p *pod) connects(t testing.TB, dst netip.AddrPort, n int) map[string]int {
	t.Helper()
	out, err := p.run(t, p.childCmd(t, "connects", request{URL: "tcp://" + dst.String(), Body: "hello", Count: n}))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	if err := json.Unmarshal([]byte(out), &seen); err != nil {
		t.Fatalf("connects output %q: %v", out, err)
	}
	return seen
}

func (p *pod) child(t testing.TB, mode string, req request) response {
	t.Helper()
	out, err := p.run(t, p.childCmd(t, mode, req))
	if err != nil {
		t.Fatal(err)
	}
	var r response
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%s output %q: %v", mode, out, err)
	}
	return r
}

// echoServer answers one line per connection with "echo: " and the line.
func echoServer(t testing.TB, ip netip.Addr) (net.Listener, netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 256)
				k, _ := c.Read(buf)
				c.Write([]byte("echo: " + string(buf[:k])))
			}()
		}
	}()
	return ln, ln.Addr().(*net.TCPAddr).AddrPort()
}

// After one sniffed connection, a destination egret passes through goes
// direct: when its port closes the pod's connects are refused by the kernel
// exactly as for a pod without egret, while an HTTP destination on the same
// host keeps coming to egret and being retried.
func TestLearnedDirectKeepsRefusal(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	pm, err := proxy.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	n := newNode(t, nodeOpts{proxy: proxy.Config{Shared: proxy.Shared{Metrics: pm}},
		logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	p := n.addPod(t, "web", podOpts{})
	off := n.addPod(t, "nolearn", podOpts{spec: pods.Pod{Learn: pods.Learning{Off: true}}})
	bare := makePod(t, n.top, "bare", podOpts{}) // not behind egret: the baseline

	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	tln, err := net.Listen("tcp", net.JoinHostPort(p.host4.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	ts.Listener = tln
	ts.StartTLS()
	t.Cleanup(ts.Close)
	tlsDst := tln.Addr().(*net.TCPAddr).AddrPort()
	rawLn, rawDst := echoServer(t, p.host4)

	// One connection each, through egret (the client is connected to the
	// pod's listener on loopback), sniffed and learned.
	r := p.child(t, "tls", request{URL: "tcp://" + tlsDst.String()})
	if r.Err != "" || !strings.HasPrefix(r.Local, "127.0.0.1:") {
		t.Fatalf("first TLS connection: %+v (want it through egret)", r)
	}
	r = p.child(t, "echo", request{URL: "tcp://" + rawDst.String(), Body: "raw"})
	if r.Err != "" || r.Body != "echo: raw\n" || !strings.HasPrefix(r.Local, "127.0.0.1:") {
		t.Fatalf("first raw connection: %+v (want it through egret)", r)
	}
	id := n.waitPod(t, "web", "running").CgroupID
	learned, err := n.loader.LearnedDirect(id)
	if err != nil {
		t.Fatal(err)
	}
	got := map[netip.AddrPort]bpfload.DirectProtocol{}
	for _, l := range learned {
		got[l.Dst] = l.Protocol
	}
	if got[tlsDst] != bpfload.DirectTLS || got[rawDst] != bpfload.DirectOther || len(got) != 2 {
		t.Fatalf("learned %v, want %s tls and %s other", got, tlsDst, rawDst)
	}
	// The next connection goes direct: the client's own address is the
	// pod's, not loopback.
	r = p.child(t, "echo", request{URL: "tcp://" + rawDst.String(), Body: "raw"})
	if r.Err != "" || !strings.HasPrefix(r.Local, p.pod4.String()+":") {
		t.Fatalf("second raw connection: %+v (want it direct)", r)
	}

	ts.Close()
	rawLn.Close()
	const count = 100
	for _, dst := range []netip.AddrPort{tlsDst, rawDst} {
		want := bare.connects(t, dst, count)
		seen := p.connects(t, dst, count)
		if fmt.Sprint(seen) != fmt.Sprint(want) || want["connect: ECONNREFUSED"] != count {
			t.Fatalf("closed %s: pod behind egret saw %v, pod without egret %v", dst, seen, want)
		}
		t.Logf("closed %s, %d connects: behind egret %v; without egret %v", dst, count, seen, want)
	}
	// With learning off, the same closed port is what a transparent proxy
	// that already accepted can do: the connect succeeds, the write is
	// taken, the read is reset.
	offSeen := off.connects(t, rawDst, count)
	if offSeen["connected, write: ok, read: ECONNRESET"] != count {
		t.Fatalf("learning off, closed port: %v", offSeen)
	}
	t.Logf("learning off, closed %s, %d connects: %v", rawDst, count, offSeen)
	// Each of them counted and logged with the pod and the destination.
	if got := promtest.CounterSum(t, reg, "egret_proxy_passthrough_dial_failures_total", "protocol", "unknown", "reason", "refused"); got != count {
		t.Fatalf("passthrough dial failures{unknown,refused} = %v, want %d", got, count)
	}
	logged := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "passthrough dial failed") && strings.Contains(line, "pod=nolearn") &&
			strings.Contains(line, "dst="+rawDst.String()) && strings.Contains(line, "reason=refused") {
			logged++
		}
	}
	if logged != count {
		t.Fatalf("%d warn lines of a failed passthrough dial with pod=nolearn dst=%s, want %d:\n%s", logged, rawDst, count, logs)
	}

	// The witness kept counting the learned-direct connections.
	st, err := n.loader.PodDirectStats(id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Connects < 2*count+1 || st.Failed < 2*count || st.Resets < 2*count || st.Established < 1 {
		t.Fatalf("direct stats %+v", st)
	}
	t.Logf("direct stats of the pod: %+v", st)
	// And the agent names them: the pod's learned-direct connects, the
	// refusals each a failure a retry could have fixed safely.
	var web *agent.DirectSummary
	for _, d := range n.agent.DirectSummaries() {
		if d.Pod == "web" && d.Path == "learned_direct" {
			web = &d
		}
	}
	if web == nil || web.Refused != 2*count || web.SafeToRetry != 2*count || web.Connects != 2*count+1 ||
		web.Established != 1 || web.Ambiguous != 0 {
		t.Fatalf("direct summary of web: %+v", web)
	}

	// HTTP on the same host still comes to egret and is retried, before
	// and after everything above.
	led, up := startLedger(t, p.host4)
	for i := range 2 {
		idem := fmt.Sprintf("learn-http-%d", i)
		r := p.curl(t, "-H", "Ledger-Id: "+idem, "-H", "Ledger-Fault: 503; times=1", url(up, "/x"))
		if r.Status != 200 || attempts(r) != 2 || led.Executions(idem) != 2 {
			t.Fatalf("HTTP on the same host: status %d, attempts %d, executions %d", r.Status, attempts(r), led.Executions(idem))
		}
	}
	learned, _ = n.loader.LearnedDirect(id)
	for _, l := range learned {
		if l.Dst == up {
			t.Fatalf("the HTTP destination %s was learned direct", up)
		}
	}
}

// A gRPC client over h2c (HTTP/2 with prior knowledge, which egret serves
// stream by stream) works through an opted-in pod, its destination is not
// learned direct (it must keep reaching egret), and once the server is
// gone its errors are the ones a pod without egret sees: egret's dials are
// refused, and it answers UNAVAILABLE (not sent) saying so.
func TestGRPCH2CThroughEgret(t *testing.T) {
	n := newNode(t, nodeOpts{})
	p := n.addPod(t, "grpc", podOpts{})
	bare := makePod(t, n.top, "bare", podOpts{})

	ln, err := net.Listen("tcp", net.JoinHostPort(p.host4.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(ln) }()
	t.Cleanup(func() { gs.Stop(); <-served })
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	call := func(q *pod, count int) map[string]int {
		t.Helper()
		out, err := q.run(t, q.childCmd(t, "grpc", request{URL: "tcp://" + dst.String(), Count: count}))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		if err := json.Unmarshal([]byte(out), &seen); err != nil {
			t.Fatalf("grpc output %q: %v", out, err)
		}
		return seen
	}

	if got := call(p, 1); got["SERVING"] != 1 {
		t.Fatalf("first gRPC call through egret: %v", got)
	}
	id := n.waitPod(t, "grpc", "running").CgroupID
	if got := call(p, 10); got["SERVING"] != 10 {
		t.Fatalf("gRPC calls through egret: %v", got)
	}
	learned, err := n.loader.LearnedDirect(id)
	if err != nil || len(learned) != 0 {
		t.Fatalf("learned %+v, %v; want nothing: egret serves h2c", learned, err)
	}

	gs.Stop()
	<-served
	served <- nil // for the cleanup
	const count = 20
	want := call(bare, count)
	got := call(p, count)
	if fmt.Sprint(got) != fmt.Sprint(want) || want["Unavailable: connection refused"] != count {
		t.Fatalf("server gone: behind egret %v, without egret %v", got, want)
	}
	t.Logf("gRPC h2c, server gone, %d calls: behind egret %v; without egret %v", count, got, want)
}
