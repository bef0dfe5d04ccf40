package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Shutdown's tests give the answers a generous grace: what they assert is
// what each request is answered, not how fast on a loaded machine; a
// Shutdown that needed the whole grace fails them.
const testAnswerGrace = 20 * time.Second

// windowsPolicy holds every window for as long as a test needs it (no
// timeout ends one before the cut), spools a 100-byte body before sending
// it, and streams a larger one.
const windowsPolicy = `
defaults:
  max_attempts: 3
  timeout: 120s
  attempt_timeout: 120s
  min_attempt: 10ms
  backoff: {kind: full, base: 5ms, max: 20ms}
  budget: {ratio: 1, min_per_second: 100, ttl: 10s}
  body: {memory_limit: 16, spool_limit: 4096}
`

// windowEnv is a proxy and the upstreams that hold requests in each window
// a request can be in when Shutdown's grace ends, each on an event.
type windowEnv struct {
	t       *testing.T
	p       *Server
	addr    string // the proxy's
	log     *lines
	release chan struct{} // closed at the end: the upstreams let go
	// poke is signalled by every event the test waits for besides the
	// server's own (an upstream reached, a client at its point).
	poke chan struct{}

	waitHead, afterHead, midBody, slowRead, upgrade, fast *upstream
	blackhole                                             string   // its dials wait for the cut
	counts                                                sync.Map // event name -> *atomic.Int64
}

func (e *windowEnv) event(name string) {
	v, _ := e.counts.LoadOrStore(name, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
	select {
	case e.poke <- struct{}{}:
	default:
	}
}

func (e *windowEnv) count(name string) int64 {
	v, ok := e.counts.Load(name)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

func newWindowEnv(t *testing.T) *windowEnv {
	e := &windowEnv{t: t, log: &lines{}, release: make(chan struct{}), poke: make(chan struct{}, 1)}
	t.Cleanup(func() { close(e.release) })
	hold := func(r *http.Request) {
		select {
		case <-e.release:
		case <-r.Context().Done():
		}
	}
	// No answer: the request has run, its response is not there yet.
	e.waitHead = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		e.event("upstream " + r.Method + " " + r.URL.Path)
		hold(r)
	})
	// The response head, then nothing.
	e.afterHead = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		hold(r)
	})
	// The head and 10 of the body's bytes, then nothing.
	e.midBody = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, "first part")
		w.(http.Flusher).Flush()
		hold(r)
	})
	// Reads one byte of a streamed body, then nothing.
	e.slowRead = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		var b [1]byte
		if _, err := io.ReadFull(r.Body, b[:]); err == nil {
			e.event("upstream reading")
		}
		hold(r)
	})
	// Switches protocols, then says nothing.
	e.upgrade = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: test\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		c.Read(make([]byte, 1)) // until the proxy's side ends
	})
	e.fast = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})
	// An address whose dials wait for the request's end: a dial in flight.
	bh, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.blackhole = bh.Addr().String()
	bh.Close()
	connectPort, _ := strconv.Atoi(strings.TrimPrefix(e.waitHead.addr, "127.0.0.1:"))
	upgradePort, _ := strconv.Atoi(strings.TrimPrefix(e.upgrade.addr, "127.0.0.1:"))
	var d net.Dialer
	p, err := New(Config{
		Policy: mustPolicy(t, windowsPolicy),
		Logger: slog.New(e.log),
		Bounds: Bounds{ConnectPorts: []int{connectPort, upgradePort}}, // an upgrade is a tunnel
		Timeouts: Timeouts{
			AnswerGrace: testAnswerGrace,
			// Every window is held by an event, never by time: no timeout of
			// the server's may end a request before the cut. (With the
			// defaults, 260 connections under -race, -count=3 and CPU load
			// took longer than the 10 s head and dial timeouts to reach their
			// windows, and the new ones were closed before the cut.)
			ReadHeaderTimeout:  10 * time.Minute,
			ReadTimeout:        10 * time.Minute,
			WriteTimeout:       10 * time.Minute,
			IdleTimeout:        10 * time.Minute,
			DialTimeout:        10 * time.Minute,
			RequestReadTimeout: 10 * time.Minute,
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == e.blackhole {
				e.event("dialing")
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-e.release:
					return nil, errors.New("test over")
				}
			}
			c, err := d.DialContext(ctx, network, addr)
			if err == nil && addr == e.afterHead.addr {
				c = &headWatch{Conn: c, e: e}
			}
			return c, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(ln)
	t.Cleanup(func() { p.Shutdown(context.Background()) })
	e.p, e.addr = p, ln.Addr().String()
	return e
}

// headWatch is a connection to the upstream that tells when the proxy has
// read a response head from it (its blank line): the proxy is past waiting
// for the head, and its runner is reading the body's first chunk.
type headWatch struct {
	net.Conn
	e      *windowEnv
	tail   []byte
	method string // of the request written on it
}

func (h *headWatch) Write(p []byte) (int, error) {
	if m, _, ok := strings.Cut(string(p), " "); ok && h.method == "" {
		h.method = m
	}
	return h.Conn.Write(p)
}

func (h *headWatch) Read(p []byte) (int, error) {
	n, err := h.Conn.Read(p)
	h.tail = append(h.tail, p[:n]...)
	if i := strings.Index(string(h.tail), "\r\n\r\n"); i >= 0 {
		h.e.event("proxy read a head " + h.method)
		h.tail = h.tail[i+4:]
	}
	if len(h.tail) > 3 {
		h.tail = h.tail[len(h.tail)-3:]
	}
	return n, err
}

// connCounts counts the proxy's connections by state.
func (e *windowEnv) connCounts() map[connState]int {
	e.p.mu.Lock()
	defer e.p.mu.Unlock()
	byState := map[connState]int{}
	for c := range e.p.conns {
		byState[c.state]++
	}
	return byState
}

// waitUntil waits for cond, woken by the server's changes and the test's
// events: no clock but the give-up one.
func (e *windowEnv) waitUntil(what string, cond func() bool) {
	e.t.Helper()
	giveUp := time.NewTimer(2 * time.Minute)
	defer giveUp.Stop()
	for !cond() {
		select {
		case <-e.p.changed:
		case <-e.poke:
		case <-giveUp.C:
			events := map[string]int64{}
			e.counts.Range(func(k, v any) bool {
				events[k.(string)] = v.(*atomic.Int64).Load()
				return true
			})
			e.t.Fatalf("timed out waiting for %s (connections by state %v; events %v)", what, e.connCounts(), events)
		}
	}
}

// A window: how a client puts a request into it (send, which returns
// what the client got once the connection is done with), and what must
// have happened (event counts and connection states) for it to be there.
type window struct {
	name string
	send func(e *windowEnv) string
	// event: the event that shows a request in the window; state: the
	// connection state it holds.
	event string
	state connState
	// want is what the client gets; wantLog the outcome of its log line
	// ("" for none).
	want, wantLog string
}

// dialProxy connects to the proxy with a deadline that only bounds a
// broken test.
func (e *windowEnv) dialProxy() (net.Conn, *bufio.Reader, error) {
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		return nil, nil, err
	}
	c.SetDeadline(time.Now().Add(3 * time.Minute))
	return c, bufio.NewReader(c), nil
}

// ending names how a connection ended: "eof" (a clean end) or "reset".
func ending(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case err == nil:
		return "complete"
	}
	return "error " + err.Error()
}

// answerOf reads one response and says what the client got: "status
// outcome" for an answer read to its end, "status then <ending>" for a
// body cut, or the connection's ending.
func answerOf(br *bufio.Reader, method string, afterHead func()) string {
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		return ending(err)
	}
	if afterHead != nil {
		afterHead()
	}
	_, err = io.Copy(io.Discard, resp.Body)
	if err != nil {
		return fmt.Sprintf("%d then %s", resp.StatusCode, ending(err))
	}
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Request.Method == http.MethodConnect && resp.StatusCode == 200 {
		// What follows is the tunnel's.
		_, err := br.ReadByte()
		return fmt.Sprintf("%d then %s", resp.StatusCode, ending(err))
	}
	return strings.TrimSpace(fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get(HeaderOutcome)))
}

// request sends raw on a new connection and reads the answer.
func (e *windowEnv) request(raw, method string, afterHead func()) string {
	c, br, err := e.dialProxy()
	if err != nil {
		return "dial: " + err.Error()
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		return "write: " + err.Error()
	}
	return answerOf(br, method, afterHead)
}

func post(u *upstream, path string) string {
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\n\r\nhello", u.url(path), u.addr)
}

func get(u *upstream, path string) string {
	return fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", u.url(path), u.addr)
}

// shutdownWindows is every window a request (or a connection) can be in
// when the grace ends, with what its client must get.
var shutdownWindows = []window{{
	name: "new connection, no request yet",
	send: func(e *windowEnv) string {
		c, br, err := e.dialProxy()
		if err != nil {
			return "dial: " + err.Error()
		}
		defer c.Close()
		_, err = br.ReadByte()
		return ending(err)
	},
	state: stateNew,
	want:  "eof",
}, {
	name: "idle keep-alive connection",
	send: func(e *windowEnv) string {
		c, br, err := e.dialProxy()
		if err != nil {
			return "dial: " + err.Error()
		}
		defer c.Close()
		io.WriteString(c, get(e.fast, "/idle"))
		if a := answerOf(br, "GET", nil); a != "200" {
			return "first request: " + a
		}
		e.event("idle")
		_, err = br.ReadByte()
		return ending(err)
	},
	event: "idle", state: stateIdle,
	want: "eof", wantLog: "relayed", // the first request's
}, {
	name: "reading the request head",
	send: func(e *windowEnv) string {
		c, br, err := e.dialProxy()
		if err != nil {
			return "dial: " + err.Error()
		}
		defer c.Close()
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\n", e.waitHead.url("/head"), e.waitHead.addr)
		e.event("head sent in part")
		return answerOf(br, "POST", nil)
	},
	event: "head sent in part", state: stateActive,
	want: "503 not-sent", wantLog: "not-sent",
}, {
	name: "reading the request body (spooled)",
	send: func(e *windowEnv) string {
		c, br, err := e.dialProxy()
		if err != nil {
			return "dial: " + err.Error()
		}
		defer c.Close()
		// Expect: 100-continue: the proxy says 100 as it begins to read
		// the body, the event that puts the request in this window.
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n", e.waitHead.url("/body"), e.waitHead.addr)
		cont, err := http.ReadResponse(br, nil)
		if err != nil || cont.StatusCode != http.StatusContinue {
			return fmt.Sprintf("no 100 Continue: %v", err)
		}
		io.WriteString(c, "0123456789")
		e.event("reading body")
		return answerOf(br, "POST", nil)
	},
	event: "reading body", state: stateActive,
	want: "503 not-sent", wantLog: "not-sent",
}, {
	name: "dialing the upstream",
	send: func(e *windowEnv) string {
		return e.request(fmt.Sprintf("POST http://%s/dial HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", e.blackhole), "POST", nil)
	},
	event: "dialing", state: stateActive,
	want: "503 not-sent", wantLog: "not-sent",
}, {
	name: "writing the request upstream (a streamed body)",
	send: func(e *windowEnv) string {
		c, br, err := e.dialProxy()
		if err != nil {
			return "dial: " + err.Error()
		}
		defer c.Close()
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 100000\r\n\r\n0123456789", e.slowRead.url("/stream"), e.slowRead.addr)
		return answerOf(br, "POST", nil)
	},
	event: "upstream reading", state: stateActive,
	want: "502 ambiguous", wantLog: "ambiguous",
}, {
	name: "waiting for the response head (POST)",
	send: func(e *windowEnv) string {
		return e.request(post(e.waitHead, "/wait"), "POST", nil)
	},
	event: "upstream POST /wait", state: stateActive,
	want: "502 ambiguous", wantLog: "ambiguous",
}, {
	name: "waiting for the response head (GET)",
	send: func(e *windowEnv) string {
		return e.request(get(e.waitHead, "/wait"), "GET", nil)
	},
	event: "upstream GET /wait", state: stateActive,
	want: "502 failed", wantLog: "failed",
}, {
	name: "response head read, no body byte yet (POST)",
	send: func(e *windowEnv) string {
		return e.request(post(e.afterHead, "/after"), "POST", nil)
	},
	event: "proxy read a head POST", state: stateActive,
	want: "502 ambiguous", wantLog: "ambiguous",
}, {
	name: "response head read, no body byte yet (GET)",
	send: func(e *windowEnv) string {
		return e.request(get(e.afterHead, "/after"), "GET", nil)
	},
	event: "proxy read a head GET", state: stateActive,
	want: "502 failed", wantLog: "failed",
}, {
	name: "relaying the response body",
	send: func(e *windowEnv) string {
		return e.request(get(e.midBody, "/body"), "GET", func() { e.event("body begun") })
	},
	event: "body begun", state: stateActive,
	want: "200 then reset", wantLog: "relayed",
}, {
	name: "CONNECT tunnel",
	send: func(e *windowEnv) string {
		return e.request(fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", e.waitHead.addr, e.waitHead.addr), "CONNECT",
			func() { e.event("tunnel") })
	},
	event: "tunnel", state: stateTunnel,
	want: "200 then reset", wantLog: "tunnel",
}, {
	name: "upgraded connection",
	send: func(e *windowEnv) string {
		return e.request(fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n", e.upgrade.url("/ws"), e.upgrade.addr), "GET",
			func() { e.event("upgraded") })
	},
	event: "upgraded", state: stateTunnel,
	want: "101 then reset", wantLog: "upgrade",
}}

// runWindows puts n requests in each window, waits until every one is
// there, shuts the server down with its grace already over, and returns
// what the clients got per window and the log lines by outcome.
func runWindows(t *testing.T, ws []window, n int) (got []map[string]int, logged map[string]int, took time.Duration) {
	e := newWindowEnv(t)
	results := make([]chan string, len(ws))
	for i, w := range ws {
		results[i] = make(chan string, n)
		for range n {
			go func() { results[i] <- w.send(e) }()
		}
	}
	want := map[connState]int{}
	for _, w := range ws {
		want[w.state] += n
	}
	e.waitUntil("every request in its window", func() bool {
		for _, w := range ws {
			if w.event != "" && e.count(w.event) < int64(n) {
				return false
			}
		}
		st := e.connCounts()
		for s, k := range want {
			if st[s] != k {
				return false
			}
		}
		return len(st) == len(want)
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the grace is over
	t0 := time.Now()
	if err := e.p.Shutdown(ctx); err == nil {
		t.Error("Shutdown with its grace over returned nil")
	}
	took = time.Since(t0)
	got = make([]map[string]int, len(ws))
	for i := range ws {
		got[i] = map[string]int{}
		for range n {
			got[i][<-results[i]]++
		}
	}
	// Every answered request was logged before its connection ended, so
	// before Shutdown returned.
	return got, e.log.byOutcome(), took
}

// TestShutdownPastGraceWindows walks every window a request can be in
// when Shutdown's grace ends, one at a time, and asserts its client's
// answer and its log line: a request that may have run is answered
// ambiguous (failed when idempotent), one that cannot have, not-sent; only
// a begun body, a tunnel or an upgraded connection is cut, with a reset.
func TestShutdownPastGraceWindows(t *testing.T) {
	for _, w := range shutdownWindows {
		t.Run(w.name, func(t *testing.T) {
			got, logged, took := runWindows(t, []window{w}, 1)
			if want := map[string]int{w.want: 1}; fmt.Sprint(got[0]) != fmt.Sprint(want) {
				t.Errorf("client got %v, want %v", got[0], want)
			}
			wantLog := map[string]int{}
			if w.wantLog != "" {
				wantLog[w.wantLog] = 1
			}
			if fmt.Sprint(logged) != fmt.Sprint(wantLog) {
				t.Errorf("log lines by outcome %v, want %v", logged, wantLog)
			}
			if took >= testAnswerGrace {
				t.Errorf("Shutdown took %v: the answer grace ran out", took)
			}
			t.Logf("%s: %v, logged %v, Shutdown %v", w.name, got[0], logged, took)
		})
	}
}

// TestShutdownPastGraceEveryWindowAtOnce: 20 requests in each window at
// once (260 connections) when the grace ends; every one gets its window's
// answer and every request its log line.
func TestShutdownPastGraceEveryWindowAtOnce(t *testing.T) {
	const n = 20
	got, logged, took := runWindows(t, shutdownWindows, n)
	wantLog := map[string]int{}
	answered, total, logWant := 0, 0, 0
	for i, w := range shutdownWindows {
		total += n
		answered += got[i][w.want]
		if fmt.Sprint(got[i]) != fmt.Sprint(map[string]int{w.want: n}) {
			t.Errorf("%s: clients got %v, want %d × %q", w.name, got[i], n, w.want)
		}
		if w.wantLog != "" {
			wantLog[w.wantLog] += n
			logWant += n
		}
	}
	if fmt.Sprint(logged) != fmt.Sprint(wantLog) {
		t.Errorf("log lines by outcome %v, want %v", logged, wantLog)
	}
	if took >= testAnswerGrace {
		t.Errorf("Shutdown took %v: the answer grace ran out", took)
	}
	logs := 0
	for _, k := range logged {
		logs += k
	}
	t.Logf("%d connections in %d windows: %d got their window's answer; %d of %d log lines %v; Shutdown %v",
		total, len(shutdownWindows), answered, logs, logWant, logged, took)
}

// TestShutdownPastGraceResetsAStalledBody: a relayed body that has begun
// when the grace ends, stalled by its upstream or by its client, is cut
// with a reset at once. The body ends with the connection (an HTTP/1.0
// client, no length): a clean close would pass for its end.
func TestShutdownPastGraceResetsAStalledBody(t *testing.T) {
	for _, tc := range []struct {
		name string
		// body writes the upstream's body; it returns when the test ends.
		body func(w http.ResponseWriter, r *http.Request, release chan struct{})
	}{{
		name: "upstream stalls",
		body: func(w http.ResponseWriter, r *http.Request, release chan struct{}) {
			io.WriteString(w, "first part")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		},
	}, {
		name: "client stalls",
		body: func(w http.ResponseWriter, r *http.Request, release chan struct{}) {
			// 64 MiB, far more than loopback's buffers hold: the proxy's
			// write to the client, who reads no more, blocks.
			chunk := []byte(strings.Repeat("x", 64<<10))
			for range 1024 {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				tc.body(w, r, release)
			})
			log := &lines{}
			p := startProxy(t, Config{Logger: slog.New(log), Timeouts: Timeouts{AnswerGrace: testAnswerGrace}})
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(3 * time.Minute)) // only a broken test's
			fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", up.url("/"))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.ContentLength != -1 || !resp.Close {
				t.Fatalf("the body is not delimited by the connection's end (length %d, close %v)", resp.ContentLength, resp.Close)
			}
			if _, err := io.ReadFull(resp.Body, make([]byte, 10)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			t0 := time.Now()
			p.Shutdown(ctx)
			took := time.Since(t0)
			n, err := io.Copy(io.Discard, resp.Body)
			if got := ending(err); got != "reset" {
				t.Errorf("the cut body ended with %s after %d more bytes, want a reset", got, n)
			}
			if took >= testAnswerGrace {
				t.Errorf("Shutdown took %v: the body was not cut at once", took)
			}
			if l := log.byOutcome(); fmt.Sprint(l) != fmt.Sprint(map[string]int{"relayed": 1}) {
				t.Errorf("log lines by outcome %v, want the request's", l)
			}
			t.Logf("%s: %s after %d more bytes; Shutdown %v", tc.name, ending(err), n, took)
		})
	}
}

// TestShutdownCutEndsASilentTransparentConnection: a transparent
// connection whose client has said nothing, egret waiting (its
// destination dialed) for whichever side speaks first, when the grace
// ends. Nothing was asked: it ends at once and cleanly, and is not passed
// through for the answer grace.
func TestShutdownCutEndsASilentTransparentConnection(t *testing.T) {
	dst, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := dst.Accept(); err == nil {
			accepted <- c
		}
	}()
	log := &lines{}
	p := startProxy(t, Config{
		Mode:     Transparent,
		Resolver: &StaticResolver{Dst: netip.MustParseAddrPort(dst.Addr().String())},
		Logger:   slog.New(log),
		Timeouts: Timeouts{AnswerGrace: testAnswerGrace, SniffTimeout: time.Millisecond},
	})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Minute)) // only a broken test's
	// egret dialed the destination: the client was silent past the sniff.
	up := <-accepted
	defer up.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	t0 := time.Now()
	p.Shutdown(ctx)
	took := time.Since(t0)
	_, err = c.Read(make([]byte, 1))
	if got := ending(err); got != "eof" {
		t.Errorf("the client's connection ended with %s, want a clean close", got)
	}
	if took >= testAnswerGrace {
		t.Errorf("Shutdown took %v: the connection was kept for the answer grace", took)
	}
	if l := log.byOutcome(); len(l) != 0 {
		t.Errorf("log lines %v for a connection that asked nothing", l)
	}
}
