package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// fastRetries is a policy with short, fixed waits so tests run quickly.
const fastRetries = `
defaults:
  max_attempts: 3
  timeout: 5s
  min_attempt: 10ms
  backoff: {kind: full, base: 5ms, max: 20ms}
  budget: {ratio: 1, min_per_second: 100, ttl: 10s}
`

func TestRetryVisibleInAttempts(t *testing.T) {
	var n atomic.Int64
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "second time lucky")
	})
	p := startProxy(t, Config{Policy: mustPolicy(t, fastRetries)})
	resp, err := p.client().Get(up.url("/flaky"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || readAll(t, resp.Body) != "second time lucky" {
		t.Fatalf("status %d", resp.StatusCode)
	}
	checkEgretHeaders(t, resp, "2")
	if up.requests.Load() != 2 {
		t.Fatalf("upstream executed %d times, want 2", up.requests.Load())
	}
	// The trace store knows the request by the id the client saw.
	id := resp.Header.Get(HeaderRequestID)
	tr, ok := waitTrace(p, id)
	if !ok {
		t.Fatalf("no trace for request %s", id)
	}
	if len(tr.Attempts) != 2 || tr.Attempts[0].Status != 503 || tr.Attempts[1].Status != 200 {
		t.Fatalf("trace attempts %+v", tr.Attempts)
	}
	if tr.Method != "GET" || !strings.HasSuffix(tr.URL, "/flaky") {
		t.Errorf("trace names %s %s", tr.Method, tr.URL)
	}
}

func TestNotSentClosedPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connect refused
	p := startProxy(t, Config{Policy: mustPolicy(t, fastRetries)})
	for _, method := range []string{"GET", "POST"} {
		req, _ := http.NewRequest(method, "http://"+addr+"/", strings.NewReader("x"))
		resp, err := p.client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 503 || resp.Header.Get(HeaderOutcome) != "not-sent" {
			t.Errorf("%s to a closed port: %d %s=%q, want 503 not-sent", method, resp.StatusCode,
				HeaderOutcome, resp.Header.Get(HeaderOutcome))
		}
		checkEgretHeaders(t, resp, "3")
	}
}

// faultServer is a raw TCP upstream: each connection is given to handle.
func faultServer(t *testing.T, handle func(c net.Conn, br *bufio.Reader)) (addr string, conns *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				handle(c, bufio.NewReader(c))
			}()
		}
	}()
	return ln.Addr().String(), conns
}

// resetConn closes c with a RST.
func resetConn(c net.Conn) {
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
}

func TestAmbiguousPostResetAfterRequest(t *testing.T) {
	var executed atomic.Int64
	addr, _ := faultServer(t, func(c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		executed.Add(1) // the whole request arrived: the server ran it
		resetConn(c)
	})
	p := startProxy(t, Config{Policy: mustPolicy(t, fastRetries)})
	resp, err := p.client().Post("http://"+addr+"/pay", "text/plain", strings.NewReader("5 EUR"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 502 || resp.Header.Get(HeaderOutcome) != "ambiguous" {
		t.Fatalf("POST reset after the request: %d %q, want 502 ambiguous", resp.StatusCode, resp.Header.Get(HeaderOutcome))
	}
	checkEgretHeaders(t, resp, "1")
	if executed.Load() != 1 {
		t.Fatalf("executed %d times, want once", executed.Load())
	}

	// The same fault on a GET is retried, and the answer says failed.
	resp, err = p.client().Get("http://" + addr + "/read")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 502 || resp.Header.Get(HeaderOutcome) != "failed" {
		t.Fatalf("GET reset after the request: %d %q, want 502 failed", resp.StatusCode, resp.Header.Get(HeaderOutcome))
	}
	checkEgretHeaders(t, resp, "3")
}

func TestAmbiguousStatusRelayedMarked(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "upstream says 502")
	})
	p := startProxy(t, Config{Policy: mustPolicy(t, fastRetries)})
	resp, err := p.client().Post(up.url("/"), "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 502 || resp.Header.Get(HeaderOutcome) != "ambiguous" {
		t.Fatalf("got %d %q, want the 502 relayed with Egret-Outcome: ambiguous", resp.StatusCode, resp.Header.Get(HeaderOutcome))
	}
	if b := readAll(t, resp.Body); b != "upstream says 502" {
		t.Fatalf("body %q", b)
	}
	checkEgretHeaders(t, resp, "1")
}

func TestTimeoutHeaderShortensNeverLengthens(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	p := startProxy(t, Config{Policy: mustPolicy(t, `
defaults:
  max_attempts: 1
  timeout: 1500ms
  min_attempt: 10ms
`)})
	get := func(header string) (time.Duration, *http.Response) {
		req, _ := http.NewRequest("GET", up.url("/slow"), nil)
		if header != "" {
			req.Header.Set(HeaderTimeoutMs, header)
		}
		start := time.Now()
		resp, err := p.client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return time.Since(start), resp
	}
	d, resp := get("200")
	if resp.StatusCode != 504 || d > time.Second {
		t.Errorf("with %s: 200: status %d after %v, want 504 well before the policy's 1.5 s", HeaderTimeoutMs, resp.StatusCode, d)
	}
	checkEgretHeaders(t, resp, "1")
	d, resp = get("60000")
	if resp.StatusCode != 504 || d < 1400*time.Millisecond || d > 5*time.Second {
		t.Errorf("with %s: 60000: status %d after %v, want 504 at the policy's 1.5 s", HeaderTimeoutMs, resp.StatusCode, d)
	}
}

func TestResponseBodyBreakAbortsClient(t *testing.T) {
	addr, _ := faultServer(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"+strings.Repeat("a", 100))
		// Not synchronisation: the upstream breaks off 50 ms into the
		// body, as a failing server does (the break, not its time, is
		// checked).
		time.Sleep(50 * time.Millisecond)
		resetConn(c)
	})
	p := startProxy(t, Config{Policy: mustPolicy(t, fastRetries)})
	for range 2 {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: x\r\n\r\n", addr)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err == nil {
			t.Fatalf("a broken upstream body ended cleanly for the client (%d bytes)", len(b))
		}
		if len(b) != 100 {
			t.Errorf("client got %d bytes before the break, want the 100 sent", len(b))
		}
		c.Close()
	}
}

// countingDial counts upstream connections open now.
type countingDial struct {
	open atomic.Int64
	max  atomic.Int64
}

func (d *countingDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	n := d.open.Add(1)
	for m := d.max.Load(); n > m && !d.max.CompareAndSwap(m, n); m = d.max.Load() {
	}
	return &countedConn{Conn: c, d: d}, nil
}

type countedConn struct {
	net.Conn
	d    *countingDial
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.d.open.Add(-1) })
	return c.Conn.Close()
}

func TestNoConnectionOrPermitHeldDuringBackoff(t *testing.T) {
	attempt := make(chan int, 4)
	proceed := make(chan struct{})
	var n atomic.Int64
	addr, _ := faultServer(t, func(c net.Conn, br *bufio.Reader) {
		for {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			k := int(n.Add(1))
			attempt <- k
			if k == 1 {
				resetConn(c) // first attempt: the connection dies, GET is retried
				return
			}
			<-proceed
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	dial := &countingDial{}
	p := startProxy(t, Config{Dial: dial.dial, Policy: mustPolicy(t, `
defaults:
  max_attempts: 2
  timeout: 10s
  min_attempt: 10ms
  bulkhead: 4
  backoff: {kind: decorrelated, base: 600ms, max: 600ms}
  budget: {ratio: 1, min_per_second: 100, ttl: 10s}
`)})
	done := make(chan *http.Response, 1)
	go func() {
		resp, err := p.client().Get("http://" + addr + "/")
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	<-attempt
	bh := func() *Bulkhead { return p.Bulkheads().Lookup(addr) }
	// Attempt 1 ended with a reset; the runner waits 600 ms. Look in the
	// middle of the wait (not synchronisation: no event marks "waiting",
	// the test looks at what is held while it lasts).
	time.Sleep(250 * time.Millisecond)
	if got := dial.open.Load(); got != 0 {
		t.Errorf("during the backoff %d upstream connections are open, want 0", got)
	}
	if b := bh(); b == nil || b.InUse() != 0 {
		t.Errorf("during the backoff the bulkhead has permits in use: %v", b)
	}
	select {
	case k := <-attempt:
		if k != 2 {
			t.Fatalf("attempt %d", k)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no second attempt")
	}
	// During attempt 2, one connection and one permit are held: the
	// counters do see an attempt.
	if got := dial.open.Load(); got != 1 {
		t.Errorf("during attempt 2, %d upstream connections open, want 1", got)
	}
	if b := bh(); b.InUse() != 1 {
		t.Errorf("during attempt 2, %d permits in use, want 1", b.InUse())
	}
	close(proceed)
	resp := <-done
	if resp == nil {
		return
	}
	checkEgretHeaders(t, resp, "2")
	readAll(t, resp.Body)
	// Polls: the permit goes back as the runner returns, after the
	// client's last byte, and nothing announces it.
	if !testenv.Poll(2*time.Second, func() bool { return bh().InUse() == 0 }) {
		t.Errorf("permit still held after the response ended")
	}
}

func TestBulkheadRejects(t *testing.T) {
	block, arrived := make(chan struct{}), make(chan struct{}, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-block
	})
	defer close(block)
	m := testMetrics(t)
	bhs := NewBulkheads()
	bhs.MaxWait = 50 * time.Millisecond
	bhs.OnReject = m.BulkheadRejected
	p := startProxy(t, Config{
		Shared: Shared{Metrics: m, Bulkheads: bhs},
		Policy: mustPolicy(t, `
defaults:
  max_attempts: 1
  bulkhead: 1
`),
	})
	go p.client().Get(up.url("/hold")) // takes the only permit
	<-arrived                          // and holds it at the upstream
	resp, err := p.client().Get(up.url("/second"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 503 || resp.Header.Get(HeaderOutcome) != "not-sent" {
		t.Fatalf("over the bulkhead: %d %q, want 503 not-sent", resp.StatusCode, resp.Header.Get(HeaderOutcome))
	}
	b := bhs.Lookup(up.addr)
	if b.Rejected() != 1 || b.InUse() != 1 {
		t.Errorf("bulkhead rejected %d, in use %d; want 1 and 1", b.Rejected(), b.InUse())
	}
	if v := counterValue(t, m.rejections.WithLabelValues(up.addr)); v != 1 {
		t.Errorf("rejections metric %v", v)
	}
}

func TestDrainDeniesRetriesAndLetsInFlightFinish(t *testing.T) {
	var n atomic.Int64
	started := make(chan struct{}, 1)
	finish := make(chan struct{})
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if r.URL.Path == "/slow" {
			started <- struct{}{}
			<-finish
			io.WriteString(w, "finished")
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	p := startProxy(t, Config{Policy: mustPolicy(t, fastRetries)})

	slow := make(chan string, 1)
	go func() {
		resp, err := p.client().Get(up.url("/slow"))
		if err != nil {
			slow <- err.Error()
			return
		}
		slow <- strconv.Itoa(resp.StatusCode) + " " + readAll(t, resp.Body)
	}()
	<-started
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- p.Shutdown(ctx)
	}()
	// Polls: Shutdown has no event for "draining" (Draining is a flag)
	// nor for its listener's close.
	testenv.Poll(2*time.Second, p.Draining)
	// New connections are refused once draining: Shutdown closes the
	// listener just after it sets the flag. Polls: no event tells of the
	// close, a refused dial does.
	testenv.Poll(2*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	if c, err := net.DialTimeout("tcp", p.addr, time.Second); err == nil {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", up.url("/"))
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			t.Error("a new connection was served after Shutdown began")
		}
		c.Close()
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a request in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(finish)
	if got := <-slow; got != "200 finished" {
		t.Fatalf("in-flight request: %s", got)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func TestDrainingDeniesRetries(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	p := startProxy(t, Config{Policy: mustPolicy(t, fastRetries)})
	resp, err := p.client().Get(up.url("/"))
	if err != nil {
		t.Fatal(err)
	}
	checkEgretHeaders(t, resp, "3")
	p.Drain()
	resp, err = p.client().Get(up.url("/"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 503 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	checkEgretHeaders(t, resp, "1")
	id := resp.Header.Get(HeaderRequestID)
	readAll(t, resp.Body)
	tr, ok := waitTrace(p, id)
	if !ok || len(tr.Attempts) != 1 || tr.Attempts[0].Decision.Reason.String() != "runtime_draining" {
		t.Fatalf("trace %+v", tr)
	}
}

// waitTrace returns the trace of request id, waiting (at most 5 s, a
// failure deadline) for the store to be given it: the runner's OnTrace runs
// as the response's body ends, after the client may have read it all. It
// watches the store before looking in it, so that no Put is missed.
func waitTrace(p *testProxy, id string) (retryTrace, bool) {
	all, done := make(chan retryTrace), make(chan struct{})
	defer close(done)
	for _, o := range []engine.Outcome{engine.OutcomeNone, engine.OutcomeNotSent, engine.OutcomeFailed, engine.OutcomeAmbiguous} {
		ch, stop := p.Traces().Watch(o, 64)
		defer stop()
		go func() {
			for tr := range ch {
				select {
				case all <- tr:
				case <-done:
				}
			}
		}()
	}
	if tr, ok := p.Traces().Get(id); ok {
		return tr, true
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case tr := <-all:
			if tr.RequestID == id {
				return tr, true
			}
		case <-deadline:
			return retryTrace{}, false
		}
	}
}

func TestShutdownClosesIdleKeepAlive(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	p := startProxy(t, Config{})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", up.url("/"))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp.Body)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with only an idle connection: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Shutdown took %v with nothing in flight", d)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Error("the idle keep-alive connection is still open after Shutdown")
	}
}

// slowReader delays every read after the first on an upstream connection,
// so that the pool notices an upstream's close late.
type slowReader struct {
	net.Conn
	reads atomic.Int64
}

func (s *slowReader) Read(p []byte) (int, error) {
	if s.reads.Add(1) > 1 {
		// Not synchronisation: the slowness this reader exists to make.
		time.Sleep(1500 * time.Millisecond)
	}
	return s.Conn.Read(p)
}

func (s *slowReader) NetConn() net.Conn { return s.Conn }

// TestAttemptsCountDispatchesNotReconnects: a DELETE gets 429 with
// Retry-After; while egret waits, the upstream resets the idle keep-alive
// connection, and the retry takes it from the pool before the pool noticed.
// Its write fails before a byte leaves and net/http sends it on a new
// connection: the upstream saw two requests, and Egret-Attempts says 2.
func TestAttemptsCountDispatchesNotReconnects(t *testing.T) {
	var arrivals, conns atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
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
			n := conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					arrivals.Add(1)
					if n == 1 {
						io.WriteString(c, "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n")
						// Not synchronisation: the idle connection is
						// reset a moment after its 429, as a server that
						// closes it does.
						time.Sleep(50 * time.Millisecond)
						c.(*net.TCPConn).SetLinger(0) // reset the idle connection
						return
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}()
		}
	}()
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &slowReader{Conn: c}, nil
	}
	p := startProxy(t, Config{Dial: dial, Policy: mustPolicy(t, fastRetries)})
	req, _ := http.NewRequest(http.MethodDelete, "http://"+ln.Addr().String()+"/x", nil)
	resp, err := p.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp.Body)
	if resp.StatusCode != 200 || conns.Load() != 2 {
		t.Fatalf("status %d on %d upstream connections (the reset connection was not reused)", resp.StatusCode, conns.Load())
	}
	checkEgretHeaders(t, resp, strconv.FormatInt(arrivals.Load(), 10))
	if arrivals.Load() != 2 {
		t.Fatalf("upstream saw %d requests, want 2", arrivals.Load())
	}
}

// connCount is how many client connections p holds.
func (p *testProxy) connCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// waitConns polls the connections the proxy holds (the server announces
// none of its accepts) until a 10 s deadline (a failure bound, not a
// count of polls, whose time a loaded machine stretches).
func waitConns(t *testing.T, p *testProxy, n int) {
	t.Helper()
	if !testenv.Poll(10*time.Second, func() bool { return p.connCount() == n }) {
		t.Fatalf("proxy holds %d connections, want %d", p.connCount(), n)
	}
}

// A connection accepted before Shutdown whose request comes after it began
// is served (with Connection: close), not reset: its client connected in
// time and cannot know the proxy is going.
func TestShutdownServesNewConnection(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "served") })
	p := startProxy(t, Config{})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitConns(t, p, 1)
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- p.Shutdown(ctx)
	}()
	testenv.Eventually(t, 5*time.Second, "the proxy draining", p.Draining) // Draining is a flag, with no event
	// Not synchronisation: the connection stays idle through several of
	// Shutdown's rounds, the delay the test is about.
	time.Sleep(50 * time.Millisecond)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", up.url("/"))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("request on a connection accepted before Shutdown: %v", err)
	}
	if body := readAll(t, resp.Body); resp.StatusCode != 200 || body != "served" || !resp.Close {
		t.Fatalf("answer %d %q, close %v", resp.StatusCode, body, resp.Close)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the answer: %v, want EOF", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// A new connection that never speaks is closed once its grace (here the
// header timeout) is over, and Shutdown ends then without waiting longer.
func TestShutdownClosesSilentNewConnection(t *testing.T) {
	p := startProxy(t, Config{Timeouts: Timeouts{ReadHeaderTimeout: 300 * time.Millisecond}})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitConns(t, p, 1)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 2*time.Second {
		t.Errorf("Shutdown took %v; the new connection's grace is 300ms", d)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the silent connection after Shutdown: %v, want EOF", err)
	}
}

// gatedListener holds each accepted connection until gate is closed: the
// moment between the kernel's accept and the Serve loop's registering it.
type gatedListener struct {
	net.Listener
	gate chan struct{}
	got  chan struct{}
}

func (l *gatedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.got <- struct{}{}
		<-l.gate
	}
	return c, err
}

// A connection accepted just as Shutdown begins, not yet registered by the
// Serve loop, is still served: Shutdown waits for the loop to end.
func TestShutdownWaitsForAcceptInHand(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "served") })
	s, err := New(Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl := &gatedListener{Listener: inner, gate: make(chan struct{}), got: make(chan struct{}, 1)}
	go s.Serve(gl)
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-gl.got // accepted by the kernel and by Accept, not yet by the server
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	testenv.Eventually(t, 5*time.Second, "the server draining", s.Draining) // Draining is a flag, with no event
	// Not synchronisation: a window in which Shutdown must not return
	// (an absence no event can show).
	time.Sleep(30 * time.Millisecond)
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) while a Serve loop held an accepted connection", err)
	default:
	}
	close(gl.gate)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", up.url("/"))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the connection accepted as Shutdown began: %v", err)
	}
	if body := readAll(t, resp.Body); resp.StatusCode != 200 || body != "served" {
		t.Fatalf("answer %d %q", resp.StatusCode, body)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}
