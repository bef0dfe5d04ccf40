package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sendHead opens a connection to the proxy and writes raw on it.
func sendRaw(t *testing.T, addr, raw string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	return c
}

func readAnswer(t *testing.T, c net.Conn) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func wantNotSent503(t *testing.T, resp *http.Response, body, says string) {
	t.Helper()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderOutcome) != "not-sent" ||
		!strings.Contains(body, says) {
		t.Fatalf("got %d %s=%q %q, want 503 not-sent saying %q", resp.StatusCode, HeaderOutcome,
			resp.Header.Get(HeaderOutcome), body, says)
	}
}

// A pod at its connection limit: one more connect is reset at once (not
// left waiting); the connections it holds still work, and a freed one is
// taken again.
func TestLimitConnections(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	m := testMetrics(t)
	p := startProxy(t, Config{Limits: Limits{Conns: 3}, Shared: Shared{Metrics: m}})
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	waitFor(t, "3 connections held", func() bool { return p.cfg.Quota.Usage().Conns == 3 })
	// The reset may come before connect(2) returns, or at the first read.
	c, err := net.Dial("tcp", p.addr)
	if err == nil {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", up.url("/"))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("a 4th connection: %v, want a reset", err)
	}
	if u := p.cfg.Quota.Usage(); u.Refused["connections"] != 1 {
		t.Errorf("usage %+v, want 1 refused connection", u)
	}
	if v := counterValue(t, m.limits.WithLabelValues("connections")); v != 1 {
		t.Errorf("egret_proxy_limit_refusals_total{limit=connections} = %v", v)
	}
	// The held ones are served.
	fmt.Fprintf(held[0], "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", up.url("/"))
	held[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	if resp, body := readAnswer(t, held[0]); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("held connection: %d %q", resp.StatusCode, body)
	}
	held[1].Close()
	waitFor(t, "a connection given back", func() bool { return p.cfg.Quota.Usage().Conns == 2 })
	resp, err := p.client().Get(up.url("/"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after one closed: %d", resp.StatusCode)
	}
}

// A pod at its in-flight limit gets its own 503 not-sent, and nothing of
// that request reaches the upstream.
func TestLimitInFlight(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 10)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "ok")
	})
	defer close(release)
	p := startProxy(t, Config{Limits: Limits{InFlight: 2}})
	for range 2 {
		sendRaw(t, p.addr, fmt.Sprintf("GET %s HTTP/1.1\r\nHost: x\r\n\r\n", up.url("/slow")))
		<-arrived
	}
	c := sendRaw(t, p.addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\npay", up.url("/pay")))
	resp, body := readAnswer(t, c)
	wantNotSent503(t, resp, body, "limit of 2 requests in flight")
	checkEgretHeaders(t, resp, "0")
	if n := up.requests.Load(); n != 2 {
		t.Fatalf("upstream saw %d requests, want 2", n)
	}
}

// Stalled uploads hold spool bytes: past the pod's limit the next upload
// is answered 503 not-sent (a known length before a byte of it is read,
// a chunked one when it would pass the limit), and the bytes come back
// when the uploads end.
func TestLimitSpoolBytes(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n)
	})
	p := startProxy(t, Config{Limits: Limits{SpoolBytes: 1 << 20}})
	const size = 600 << 10
	// One stalled upload of known length holds 600 KiB.
	stalled := sendRaw(t, p.addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", up.url("/up"), size)+strings.Repeat("a", 1000))
	waitFor(t, "600 KiB held", func() bool { return p.cfg.Quota.Usage().SpoolBytes == size })
	c := sendRaw(t, p.addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", up.url("/up"), size))
	resp, body := readAnswer(t, c)
	wantNotSent503(t, resp, body, "limit of 1048576 request-body bytes held")
	// A chunked upload is refused once it would pass the limit.
	chunk := strings.Repeat("b", 100<<10)
	cc := sendRaw(t, p.addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", up.url("/up")))
	go func() {
		for range 8 {
			if _, err := fmt.Fprintf(cc, "%x\r\n%s\r\n", len(chunk), chunk); err != nil {
				return
			}
		}
	}()
	resp, body = readAnswer(t, cc)
	wantNotSent503(t, resp, body, "request-body bytes held")
	if up.requests.Load() != 0 {
		t.Fatalf("a refused upload reached the upstream")
	}
	// The stalled upload ends: its bytes come back, an upload fits again.
	io.WriteString(stalled, strings.Repeat("a", size-1000))
	if resp, body := readAnswer(t, stalled); resp.StatusCode != 200 || body != fmt.Sprint(size) {
		t.Fatalf("stalled upload: %d %q", resp.StatusCode, body)
	}
	waitFor(t, "spool bytes given back", func() bool { return p.cfg.Quota.Usage().SpoolBytes == 0 })
	c = sendRaw(t, p.addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", up.url("/up"), size, strings.Repeat("c", size)))
	if resp, body := readAnswer(t, c); resp.StatusCode != 200 || body != fmt.Sprint(size) {
		t.Fatalf("upload after: %d %q", resp.StatusCode, body)
	}
}

// A body trickled a byte at a time, each byte well within ReadTimeout,
// ends at the request's deadline (RequestReadTimeout) with 408, and never
// reaches the upstream.
func TestRequestReadDeadlineEndsATrickle(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })
	p := startProxy(t, Config{Timeouts: Timeouts{ReadTimeout: 10 * time.Second, RequestReadTimeout: 800 * time.Millisecond}})
	c := sendRaw(t, p.addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n", up.url("/up")))
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if _, err := c.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	start := time.Now()
	resp, body := readAnswer(t, c)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, "not received in time") {
		t.Fatalf("trickled body: %d %q", resp.StatusCode, body)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the trickle ended after %v", d)
	}
	if up.requests.Load() != 0 {
		t.Fatal("a trickled body reached the upstream")
	}
}

// The descriptor account: connections past the capacity are refused and
// Exhausted is signalled; room again (a tenth free) is signalled too.
func TestFDsExhaustedAndBack(t *testing.T) {
	f := NewFDs(DefaultFDReserve+20, 0) // room for 10 connections
	if f.Capacity() != 20 || f.FairShare() != 2 {
		t.Fatalf("capacity %d, fair share %d", f.Capacity(), f.FairShare())
	}
	q := NewQuota(Limits{Conns: 100}, f)
	for i := range 10 {
		if _, ok := q.takeConn(); !ok {
			t.Fatalf("connection %d refused", i)
		}
	}
	if kind, ok := q.takeConn(); ok || kind != limitDescriptors {
		t.Fatalf("11th connection: %v %d", ok, kind)
	}
	select {
	case <-f.Changed():
	default:
		t.Fatal("exhaustion not signalled")
	}
	if !f.Exhausted() {
		t.Fatal("not exhausted")
	}
	q.putConn()
	if !f.Exhausted() {
		t.Fatal("back after one connection: no margin")
	}
	q.putConn()
	select {
	case <-f.Changed():
	default:
		t.Fatal("room not signalled")
	}
	if f.Exhausted() || f.Used() != 16 {
		t.Fatalf("exhausted %v, used %d", f.Exhausted(), f.Used())
	}
}

// Two pods' servers share the node's descriptors but not their limits:
// pod A at its connection limit (silent connections) and its in-flight
// limit leaves pod B's requests untouched.
func TestLimitsIsolatePods(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stall" {
			<-release
		}
		io.WriteString(w, "ok")
	})
	defer close(release)
	fds := NewFDs(DefaultFDReserve+400, 0)
	a := startProxy(t, Config{Quota: NewQuota(Limits{Conns: 20, InFlight: 5}, fds)})
	b := startProxy(t, Config{Quota: NewQuota(Limits{Conns: 20, InFlight: 5}, fds)})
	for range 100 {
		// Past A's limit the connect may fail already (reset).
		if c, err := net.Dial("tcp", a.addr); err == nil {
			defer c.Close()
		}
	}
	waitFor(t, "a at its limit", func() bool { return a.cfg.Quota.Usage().Refused["connections"] >= 80 })
	ok := 0
	client := b.client()
	for range 200 {
		resp, err := client.Get(up.url("/"))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				ok++
			}
		}
	}
	if ok != 200 {
		t.Fatalf("pod B: %d of 200 succeeded with pod A at its limit", ok)
	}
	t.Logf("pod A: %+v; pod B: %d/200 ok", a.cfg.Quota.Usage(), ok)
}

// A body that may go to a spool file needs a descriptor for it: when the
// process has none left, 503 not-sent, and nothing reaches the upstream.
func TestSpoolFileNeedsADescriptor(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })
	fds := NewFDs(DefaultFDReserve+4, 0) // two connections
	p := startProxy(t, Config{Quota: NewQuota(Limits{}, fds)})
	other, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	waitFor(t, "a connection held", func() bool { return fds.Used() == 2 })
	const size = 100 << 10 // past the 64 KiB held in memory
	c := sendRaw(t, p.addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", up.url("/"), size, strings.Repeat("x", size)))
	resp, body := readAnswer(t, c)
	wantNotSent503(t, resp, body, "out of file descriptors for request bodies")
	if up.requests.Load() != 0 {
		t.Fatal("the body reached the upstream")
	}
	c.Close()
	waitFor(t, "the refused request's connection gone", func() bool { return fds.Used() == 2 })
	// A small body, held in memory, needs none.
	c = sendRaw(t, p.addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nsmall", up.url("/")))
	if resp, _ := readAnswer(t, c); resp.StatusCode != 200 {
		t.Fatalf("a small body: %d", resp.StatusCode)
	}
}
