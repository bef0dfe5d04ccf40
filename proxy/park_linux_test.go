package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// parkRig is a proxy whose idle keep-alive connections park after a few
// milliseconds, an upstream that echoes what it got, and ways to wait for
// the parker's work without sleeping: on the count of parked connections
// (the server's onPark hook) and of open ones (the server's changed).
type parkRig struct {
	t      *testing.T
	s      *Server
	addr   string
	up     *upstream
	parked chan struct{}
}

const testParkAfter = 20 * time.Millisecond

func startParkRig(t *testing.T, cfg Config) *parkRig {
	t.Helper()
	r := &parkRig{t: t, parked: make(chan struct{}, 1)}
	r.up = startUpstream(t, func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		fmt.Fprintf(w, "%s %s %q", req.Method, req.URL.Path, b)
	})
	if cfg.ParkAfter == 0 {
		cfg.ParkAfter = testParkAfter
	}
	if cfg.Mode == Transparent {
		cfg.Resolver = &StaticResolver{Dst: r.up.addrPort(t)}
	}
	cfg.Logger = testLogger(t)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.park == nil {
		t.Fatal("no parker: idle connections are parked on Linux")
	}
	// Set before Serve: the parker goroutine reads it.
	s.onPark = func() {
		select {
		case r.parked <- struct{}{}:
		default:
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	r.s, r.addr = s, ln.Addr().String()
	return r
}

// waitParked waits until want of the server's connections are parked.
func (r *parkRig) waitParked(want int64) {
	r.t.Helper()
	giveUp := time.NewTimer(time.Minute)
	defer giveUp.Stop()
	for r.s.parked.Load() != want {
		select {
		case <-r.parked:
		case <-giveUp.C:
			r.t.Fatalf("%d connections parked, want %d", r.s.parked.Load(), want)
		}
	}
}

// waitConns waits until the server has want connections open.
func (r *parkRig) waitConns(want int) {
	r.t.Helper()
	giveUp := time.NewTimer(time.Minute)
	defer giveUp.Stop()
	for {
		r.s.mu.Lock()
		n := len(r.s.conns)
		r.s.mu.Unlock()
		if n == want {
			return
		}
		select {
		case <-r.s.changed:
		case <-giveUp.C:
			r.t.Fatalf("%d connections open, want %d", n, want)
		}
	}
}

// client is one keep-alive client connection.
type parkClient struct {
	c  net.Conn
	br *bufio.Reader
}

func (r *parkRig) dial() *parkClient {
	r.t.Helper()
	c, err := net.Dial("tcp", r.addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { c.Close() })
	return &parkClient{c: c, br: bufio.NewReader(c)}
}

// target is the request target: absolute-form in explicit mode.
func (r *parkRig) target(path string) string {
	if r.s.cfg.Mode == Transparent {
		return path
	}
	return r.up.url(path)
}

func (r *parkRig) get(path string) string {
	return fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", r.target(path), r.up.addr)
}

func (r *parkRig) post(path, body string) string {
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", r.target(path), r.up.addr, len(body), body)
}

// send writes raw at once and reads the answers to the methods given.
func (pc *parkClient) send(t *testing.T, raw string, methods ...string) []string {
	t.Helper()
	pc.c.SetDeadline(time.Now().Add(30 * time.Second))
	defer pc.c.SetDeadline(time.Time{})
	if _, err := io.WriteString(pc.c, raw); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range methods {
		resp, err := http.ReadResponse(pc.br, &http.Request{Method: m})
		if err != nil {
			t.Fatalf("reading the answer to %s: %v", m, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d %s", resp.StatusCode, b))
	}
	return got
}

func (pc *parkClient) expect(t *testing.T, raw string, want ...string) {
	t.Helper()
	methods := make([]string, len(want))
	for i, w := range want {
		methods[i], _, _ = strings.Cut(strings.TrimPrefix(w, "200 "), " ")
	}
	if got := pc.send(t, raw, methods...); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("answers %q, want %q", got, want)
	}
}

// ending reads until the connection ends: "eof" for a clean close.
func (pc *parkClient) ending(t *testing.T) string {
	t.Helper()
	pc.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := pc.br.Read(make([]byte, 1))
	switch {
	case n > 0:
		return "a byte"
	case errors.Is(err, io.EOF):
		return "eof"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	}
	return err.Error()
}

// connGoroutines counts the goroutines serving a client connection.
func connGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return bytes.Count(buf, []byte("proxy.(*conn).serve(")) + bytes.Count(buf, []byte("proxy.(*conn).resume("))
}

// waitGoroutines waits until at most want goroutines serve connections:
// a parked connection's goroutine returns right after the parker took it.
// A wait on a condition that nothing signals, so it yields and looks
// again, up to a minute.
func waitGoroutines(t *testing.T, count func() int, want int) {
	t.Helper()
	giveUp := time.Now().Add(time.Minute)
	for count() > want {
		if time.Now().After(giveUp) {
			t.Fatalf("%d goroutines, want at most %d", count(), want)
		}
		runtime.Gosched()
	}
}

// TestParkedConnServesNextRequest: a keep-alive connection idle for
// ParkAfter is parked, holding no goroutine, and its next request, a GET,
// a POST with its body, two requests pipelined in one write, a head in
// two writes, is served as on a connection that never parked. Both modes.
func TestParkedConnServesNextRequest(t *testing.T) {
	for _, mode := range []Mode{Explicit, Transparent} {
		t.Run(mode.String(), func(t *testing.T) {
			r := startParkRig(t, Config{Mode: mode})
			const n = 10
			cs := make([]*parkClient, n)
			for i := range cs {
				cs[i] = r.dial()
				cs[i].expect(t, r.get("/first"), `200 GET /first ""`)
			}
			r.waitParked(n)
			waitGoroutines(t, connGoroutines, 0)
			if got := r.s.parked.Load(); got != n {
				t.Fatalf("%d parked, want %d", got, n)
			}
			pc := cs[0]
			pc.expect(t, r.get("/again"), `200 GET /again ""`)
			r.waitParked(n)
			pc.expect(t, r.post("/pay", "amount=10&to=x"), `200 POST /pay "amount=10&to=x"`)
			r.waitParked(n)
			pc.expect(t, r.get("/one")+r.post("/two", "2")+r.get("/three"),
				`200 GET /one ""`, `200 POST /two "2"`, `200 GET /three ""`)
			r.waitParked(n)
			// The head in two writes: the first resumes the connection,
			// the rest is waited for under the head's deadline.
			head := r.get("/split")
			pc.c.SetDeadline(time.Now().Add(30 * time.Second))
			io.WriteString(pc.c, head[:10])
			pc.expect(t, head[10:], `200 GET /split ""`)
			r.waitParked(n)
			// Every other connection too.
			for i, c := range cs[1:] {
				c.expect(t, r.get(fmt.Sprint("/", i)), fmt.Sprintf(`200 GET /%d ""`, i))
			}
			r.waitParked(n)
			if got := r.up.requests.Load(); got != n+6+n-1 {
				t.Errorf("upstream got %d requests, want %d", got, n+6+n-1)
			}
		})
	}
}

// TestParkedIdleTimeout: a parked connection is closed cleanly at the end
// of its idle time (IdleTimeout after its last request), not at ParkAfter,
// and nothing of it is left.
func TestParkedIdleTimeout(t *testing.T) {
	const idle = 400 * time.Millisecond
	r := startParkRig(t, Config{Timeouts: Timeouts{IdleTimeout: idle}})
	pc := r.dial()
	pc.expect(t, r.get("/"), `200 GET / ""`)
	t0 := time.Now()
	r.waitParked(1)
	if got := pc.ending(t); got != "eof" {
		t.Fatalf("the idle connection ended with %s, want eof", got)
	}
	// The server's idle time began before t0, when it had written the
	// answer; it cannot have ended at ParkAfter.
	if took := time.Since(t0); took < idle-100*time.Millisecond {
		t.Errorf("closed %v after its last answer, want about %v", took, idle)
	}
	r.waitConns(0)
	if got := r.s.parked.Load(); got != 0 {
		t.Errorf("%d still parked", got)
	}
}

// TestParkedPeerCloseReleases: a client that closes its parked connection
// gives back its connection slot and descriptors at once, not at the end
// of the idle time: the next connection, at a limit of one, is served.
func TestParkedPeerCloseReleases(t *testing.T) {
	fds := NewFDs(1000, 10)
	m := testMetrics(t)
	r := startParkRig(t, Config{Quota: NewQuota(Limits{Conns: 1}, fds), Shared: Shared{Metrics: m}})
	pc := r.dial()
	pc.expect(t, r.get("/"), `200 GET / ""`)
	r.waitParked(1)
	if u := r.s.cfg.Quota.Usage(); u.Conns != 1 || fds.Used() != fdsPerConn {
		t.Fatalf("parked: usage %+v, descriptors %d; want 1 connection, %d descriptors", u, fds.Used(), fdsPerConn)
	}
	pc.c.Close()
	r.waitParked(0)
	r.waitConns(0)
	if u := r.s.cfg.Quota.Usage(); u.Conns != 0 || fds.Used() != 0 {
		t.Fatalf("closed: usage %+v, descriptors %d; want none", u, fds.Used())
	}
	var g dto.Metric
	if err := m.conns.Write(&g); err != nil || g.GetGauge().GetValue() != 0 {
		t.Errorf("client_connections %v (%v), want 0", g.GetGauge().GetValue(), err)
	}
	next := r.dial()
	next.expect(t, r.get("/next"), `200 GET /next ""`)
	if u := r.s.cfg.Quota.Usage(); len(u.Refused) != 0 {
		t.Errorf("refusals %v, want none", u.Refused)
	}
}

// TestShutdownClosesParked: Shutdown closes parked keep-alive connections
// at once, cleanly, as it closes idle ones; a parked connection not yet
// spoken on may still send its first request within the first request's
// grace, and one that does not is closed then.
func TestShutdownClosesParked(t *testing.T) {
	r := startParkRig(t, Config{Timeouts: Timeouts{ReadHeaderTimeout: 2 * time.Second}})
	const n = 5
	idle := make([]*parkClient, n)
	for i := range idle {
		idle[i] = r.dial()
		idle[i].expect(t, r.get("/"), `200 GET / ""`)
	}
	speaks, silent := r.dial(), r.dial()
	r.waitParked(n + 2)
	r.s.mu.Lock()
	for c := range r.s.conns {
		if c.state == stateActive || c.state == stateTunnel {
			t.Errorf("a connection in state %d", c.state)
		}
	}
	r.s.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done <- r.s.Shutdown(ctx)
	}()
	for i, pc := range idle {
		if got := pc.ending(t); got != "eof" {
			t.Errorf("idle connection %d ended with %s, want eof", i, got)
		}
	}
	// The new connection's first request, sent after Shutdown began, is
	// served (and its connection closed after it).
	got := speaks.send(t, r.get("/late"), "GET")
	if want := `200 GET /late ""`; got[0] != want {
		t.Errorf("first request during Shutdown: %q, want %q", got[0], want)
	}
	if e := speaks.ending(t); e != "eof" {
		t.Errorf("after its answer the connection ended with %s, want eof", e)
	}
	if e := silent.ending(t); e != "eof" {
		t.Errorf("the silent new connection ended with %s, want eof", e)
	}
	if err := <-done; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if got := r.s.parked.Load(); got != 0 {
		t.Errorf("%d still parked", got)
	}
}

// TestShutdownPastGraceParked: with the grace already over, a parked idle
// connection and a parked new one are closed cleanly, as the same
// connections waiting with their goroutines are (TestShutdownPastGrace*).
func TestShutdownPastGraceParked(t *testing.T) {
	r := startParkRig(t, Config{Timeouts: Timeouts{AnswerGrace: 20 * time.Second}})
	idle := r.dial()
	idle.expect(t, r.get("/"), `200 GET / ""`)
	silent := r.dial()
	r.waitParked(2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	t0 := time.Now()
	if err := r.s.Shutdown(ctx); err == nil {
		t.Error("Shutdown with its grace over returned nil")
	}
	if took := time.Since(t0); took > 10*time.Second {
		t.Errorf("Shutdown took %v: the answer grace ran out", took)
	}
	for name, pc := range map[string]*parkClient{"idle": idle, "new": silent} {
		if got := pc.ending(t); got != "eof" {
			t.Errorf("%s connection ended with %s, want eof", name, got)
		}
	}
}

// TestManyParkedConns: 2,000 parked connections hold no goroutine, and
// each serves one more request, then parks again.
func TestManyParkedConns(t *testing.T) {
	const n = 2000
	r := startParkRig(t, Config{})
	before := runtime.NumGoroutine()
	cs := make([]*parkClient, n)
	forEach := func(f func(i int, pc *parkClient)) {
		var wg sync.WaitGroup
		next := make(chan int)
		for range 16 {
			wg.Go(func() {
				for i := range next {
					f(i, cs[i])
				}
			})
		}
		for i := range cs {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	for i := range cs {
		cs[i] = r.dial()
	}
	forEach(func(i int, pc *parkClient) {
		pc.expect(t, r.get(fmt.Sprint("/a", i)), fmt.Sprintf(`200 GET /a%d ""`, i))
	})
	r.waitParked(n)
	// A few goroutines may come and go (the upstream's connections):
	// nowhere near one per client connection.
	waitGoroutines(t, runtime.NumGoroutine, before+50)
	forEach(func(i int, pc *parkClient) {
		pc.expect(t, r.post(fmt.Sprint("/b", i), "x"), fmt.Sprintf(`200 POST /b%d "x"`, i))
	})
	r.waitParked(n)
	waitGoroutines(t, runtime.NumGoroutine, before+50)
	if got := r.up.requests.Load(); got != 2*n {
		t.Errorf("upstream got %d requests, want %d", got, 2*n)
	}
}

// hiddenListener hands out connections without their SyscallConn, as a
// wrapped connection (a pipe, a test's conn) may come.
type hiddenListener struct{ net.Listener }

func (l hiddenListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return struct{ net.Conn }{c}, nil
}

// TestUnparkableConnKeepsGoroutine: a connection without a SyscallConn
// is never parked; it is served and ends at its idle time as before.
func TestUnparkableConnKeepsGoroutine(t *testing.T) {
	r := startParkRig(t, Config{}) // for its upstream; its server stays unused
	var mu sync.Mutex
	most := int64(0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Timeouts: Timeouts{IdleTimeout: 300 * time.Millisecond, ParkAfter: testParkAfter}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	s.onPark = func() {
		mu.Lock()
		most = max(most, s.parked.Load())
		mu.Unlock()
	}
	go s.Serve(hiddenListener{ln})
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	r.s, r.addr = s, ln.Addr().String()
	pc := r.dial()
	pc.expect(t, r.get("/1"), `200 GET /1 ""`)
	pc.expect(t, r.get("/2"), `200 GET /2 ""`)
	if got := pc.ending(t); got != "eof" {
		t.Fatalf("ended with %s, want eof at the idle timeout", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if most != 0 {
		t.Errorf("%d parked, want none", most)
	}
}
