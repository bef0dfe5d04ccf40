package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent/services"
)

// svcBackend is one endpoint of a test Service: a real HTTP server on its
// own loopback address, counting requests and connections.
type svcBackend struct {
	addr   netip.AddrPort
	status atomic.Int32
	hits   atomic.Int64
	conns  atomic.Int64
	mu     sync.Mutex
	closed chan struct{} // closed when a connection that carried a request closes
}

// startBackends listens on 127.0.0.2..(n+1), all on one port (an
// EndpointSlice gives its endpoints one port).
func startBackends(t *testing.T, n int) []*svcBackend {
	t.Helper()
	for try := 0; try < 20; try++ {
		port := freePort(t)
		var lns []net.Listener
		ok := true
		for i := range n {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", i+2, port))
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, ln)
		}
		if !ok {
			for _, ln := range lns {
				ln.Close()
			}
			continue
		}
		var bs []*svcBackend
		for _, ln := range lns {
			b := &svcBackend{addr: addrPortOf(t, ln), closed: make(chan struct{}, 64)}
			b.status.Store(200)
			used := sync.Map{}
			srv := &http.Server{
				Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					b.hits.Add(1)
					w.WriteHeader(int(b.status.Load()))
					io.WriteString(w, b.addr.String())
				}),
				ConnState: func(c net.Conn, s http.ConnState) {
					switch s {
					case http.StateNew:
						b.conns.Add(1)
					case http.StateActive:
						used.Store(c, true)
					case http.StateClosed, http.StateHijacked:
						if _, ok := used.LoadAndDelete(c); ok {
							b.closed <- struct{}{}
						}
					}
				},
			}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })
			bs = append(bs, b)
		}
		return bs
	}
	t.Fatal("no port free on 127.0.0.2-4")
	return nil
}

// clusterIP is the Service's virtual address in the tests: a real
// listener on 127.0.0.9 that counts the connections egret makes to it
// (none, for a Service egret balances) and answers as kube-proxy's choice
// would.
func startClusterIP(t *testing.T) (netip.AddrPort, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.9:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "clusterip") }),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				n.Add(1)
			}
		},
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return addrPortOf(t, ln), &n
}

func serviceTable(t *testing.T, vip netip.AddrPort, unsupported string, bs []*svcBackend, ready bool) *services.Table {
	t.Helper()
	tb := services.New(services.Options{Logger: testLogger(t)})
	tb.ApplyService(services.Spec{Namespace: "shop", Name: "backend", ClusterIPs: []netip.Addr{vip.Addr()},
		Ports: []services.ServicePort{{Name: "http", Port: vip.Port()}}, Unsupported: unsupported})
	setSlice(tb, bs, ready)
	return tb
}

func setSlice(tb *services.Table, bs []*svcBackend, ready bool) {
	sl := services.Slice{}
	for _, b := range bs {
		sl.Ports = []services.SlicePort{{Name: "http", Port: b.addr.Port()}}
		sl.Endpoints = append(sl.Endpoints, services.Endpoint{Addr: b.addr.Addr(), Ready: ready, Serving: ready})
	}
	tb.ApplySlice("shop", "backend", "backend-abc", &sl)
}

// get sends one GET on a new client connection and returns the answer's
// status, outcome and request id.
func svcGet(t *testing.T, p *testProxy, host string) (int, string, string) {
	t.Helper()
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get(HeaderOutcome), resp.Header.Get(HeaderRequestID)
}

const servicePolicy = `
upstreams:
  - service: shop/backend
    budget: {ratio: 1, min_per_second: 100}
`

func TestServiceSpreadsOverEndpoints(t *testing.T) {
	bs := startBackends(t, 3)
	vip, vipConns := startClusterIP(t)
	tb := serviceTable(t, vip, "", bs, true)
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: vip}, Shared: Shared{Services: tb}, Policy: mustPolicy(t, servicePolicy)})
	for range 300 {
		if st, _, _ := svcGet(t, p, "backend.shop.svc.cluster.local"); st != 200 {
			t.Fatalf("status %d", st)
		}
	}
	for _, b := range bs {
		t.Logf("endpoint %s: %d of 300 GETs, %d connections", b.addr, b.hits.Load(), b.conns.Load())
		if b.hits.Load() < 60 {
			t.Errorf("endpoint %s got %d of 300 GETs, less than a fifth", b.addr, b.hits.Load())
		}
	}
	if n := vipConns.Load(); n != 0 {
		t.Errorf("%d connections to the ClusterIP; want none (egret dials the endpoints)", n)
	}
}

func TestServiceRetryGoesToAnotherEndpoint(t *testing.T) {
	bs := startBackends(t, 3)
	bs[1].status.Store(503)
	vip, _ := startClusterIP(t)
	tb := serviceTable(t, vip, "", bs, true)
	traces := NewTraces(0)
	p := startProxy(t, Config{
		Mode:     Transparent,
		Resolver: &StaticResolver{Dst: vip},
		Shared:   Shared{Services: tb},
		Policy:   mustPolicy(t, servicePolicy),
		Traces:   traces,
	})
	ok, retried := 0, 0
	for range 300 {
		st, _, id := svcGet(t, p, "backend.shop.svc.cluster.local")
		if st == 200 {
			ok++
		}
		tr, found := traces.Get(id)
		if !found {
			t.Fatalf("no trace for %s", id)
		}
		if tr.Upstream != "shop/backend:"+strconv.Itoa(int(vip.Port())) {
			t.Fatalf("trace upstream %q, want the Service's name", tr.Upstream)
		}
		if len(tr.Attempts) > 1 {
			retried++
			seen := map[string]bool{}
			for _, a := range tr.Attempts {
				if seen[a.Endpoint] {
					t.Errorf("request %s went twice to %s: %s", id, a.Endpoint, tr.Explain())
				}
				seen[a.Endpoint] = true
			}
		}
	}
	t.Logf("%d of 300 answered 200, %d retried; the 503 endpoint saw %d", ok, retried, bs[1].hits.Load())
	if ok != 300 {
		t.Errorf("%d of 300 GETs answered 200; want all", ok)
	}
	if retried == 0 || bs[1].hits.Load() == 0 {
		t.Errorf("the failing endpoint was never tried (%d retried): the test proves nothing", retried)
	}
}

func TestServiceEndpointLeftClosesItsConnection(t *testing.T) {
	bs := startBackends(t, 1)
	vip, _ := startClusterIP(t)
	tb := serviceTable(t, vip, "", bs, true)
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: vip}, Shared: Shared{Services: tb}, Policy: mustPolicy(t, servicePolicy)})
	if st, _, _ := svcGet(t, p, "x"); st != 200 {
		t.Fatalf("status %d", st)
	}
	if n := bs[0].conns.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
	// The endpoint leaves the slice; what the agent does when the table
	// says so.
	setSlice(tb, nil, true)
	gone, _ := tb.TakeGone()
	if len(gone) != 1 || gone[0] != bs[0].addr.String() {
		t.Fatalf("gone %v, want [%s]", gone, bs[0].addr)
	}
	p.Server.CloseEndpoints(gone)
	select {
	case <-bs[0].closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the pooled connection to the endpoint that left is still open")
	}
	st, outcome, _ := svcGet(t, p, "x")
	if st != http.StatusServiceUnavailable || outcome != "not-sent" {
		t.Errorf("with no endpoint left: %d %q, want 503 not-sent", st, outcome)
	}
	if n := bs[0].hits.Load(); n != 1 {
		t.Errorf("the endpoint that left got %d requests, want the 1 before it left", n)
	}
}

func TestServiceNoReadyEndpointNotSent(t *testing.T) {
	bs := startBackends(t, 2)
	vip, vipConns := startClusterIP(t)
	tb := serviceTable(t, vip, "", bs, false)
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: vip}, Shared: Shared{Services: tb}, Policy: mustPolicy(t, servicePolicy)})
	st, outcome, _ := svcGet(t, p, "x")
	if st != http.StatusServiceUnavailable || outcome != "not-sent" {
		t.Errorf("0 ready endpoints: %d %q, want 503 not-sent", st, outcome)
	}
	if n := vipConns.Load() + bs[0].conns.Load() + bs[1].conns.Load(); n != 0 {
		t.Errorf("%d connections made; want none", n)
	}
}

func TestServiceUnsupportedGoesThroughClusterIP(t *testing.T) {
	bs := startBackends(t, 2)
	vip, vipConns := startClusterIP(t)
	tb := serviceTable(t, vip, services.WhySessionAffinity, bs, true)
	traces := NewTraces(0)
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: vip}, Shared: Shared{Services: tb}, Traces: traces})
	st, _, id := svcGet(t, p, "x")
	if st != 200 || vipConns.Load() != 1 || bs[0].hits.Load()+bs[1].hits.Load() != 0 {
		t.Fatalf("status %d, %d ClusterIP connections, %d endpoint hits: want 200 through the ClusterIP alone",
			st, vipConns.Load(), bs[0].hits.Load()+bs[1].hits.Load())
	}
	tr, _ := traces.Get(id)
	if want := "shop/backend:" + strconv.Itoa(int(vip.Port())); tr.Upstream != want {
		t.Errorf("upstream %q, want %q", tr.Upstream, want)
	}
	if tr.Note == "" {
		t.Errorf("the trace does not say the Service is left to kube-proxy")
	}
	t.Log(tr.Explain())
}

// A pod that dials an endpoint itself with a Host naming the Service is
// attributed to the Service, and its request goes where it sent it; a
// Host naming the Service to an address that is not one of its
// endpoints is not.
func TestServiceNamedByHostToItsEndpoint(t *testing.T) {
	bs := startBackends(t, 2)
	vip, vipConns := startClusterIP(t)
	tb := serviceTable(t, vip, "", bs, true)
	traces := NewTraces(0)
	res := &StaticResolver{Dst: bs[1].addr}
	p := startProxy(t, Config{Mode: Transparent, Resolver: res, Shared: Shared{Services: tb}, Traces: traces})
	st, _, id := svcGet(t, p, "backend.shop.svc.cluster.local")
	tr, _ := traces.Get(id)
	if want := "shop/backend:" + strconv.Itoa(int(vip.Port())); st != 200 || tr.Upstream != want {
		t.Errorf("status %d, upstream %q; want 200 from %q", st, tr.Upstream, want)
	}
	if bs[1].hits.Load() != 1 || bs[0].hits.Load() != 0 || vipConns.Load() != 0 {
		t.Errorf("hits %d/%d, ClusterIP %d: want the endpoint the pod chose", bs[0].hits.Load(), bs[1].hits.Load(), vipConns.Load())
	}
	other := startBackends(t, 1)[0]
	p = startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: other.addr}, Shared: Shared{Services: tb}, Traces: traces})
	_, _, id = svcGet(t, p, "backend.shop.svc.cluster.local")
	if tr, _ := traces.Get(id); tr.Upstream == "shop/backend:"+strconv.Itoa(int(vip.Port())) {
		t.Errorf("a Host naming the Service took a destination that is not its endpoint")
	}
}
