package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

const smallBodies = `
defaults:
  max_attempts: 3
  timeout: 5s
  min_attempt: 10ms
  backoff: {kind: full, base: 5ms, max: 20ms}
  budget: {ratio: 1, min_per_second: 100, ttl: 10s}
  body: {memory_limit: 16, spool_limit: 64}
`

// flakyRecorder answers 503 to the first attempt of each request and 200
// to the next, recording every body it receives by path.
type flakyRecorder struct {
	mu     sync.Mutex
	bodies map[string][]string
}

func (f *flakyRecorder) handler(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	f.mu.Lock()
	if err == nil {
		f.bodies[r.URL.Path] = append(f.bodies[r.URL.Path], string(b))
	}
	n := len(f.bodies[r.URL.Path])
	f.mu.Unlock()
	if n == 1 {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintf(w, "got %d", len(b))
}

func (f *flakyRecorder) get(path string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.bodies[path]...)
}

func TestBodiesBySize(t *testing.T) {
	rec := &flakyRecorder{bodies: map[string][]string{}}
	up := startUpstream(t, rec.handler)
	spoolDir := t.TempDir()
	p := startProxy(t, Config{Policy: mustPolicy(t, smallBodies), Shared: Shared{SpoolDir: spoolDir}})
	cases := []struct {
		size     int
		chunked  bool
		attempts string
		status   int
	}{
		{10, false, "2", 200},  // in memory: replayable
		{16, true, "2", 200},   // in memory, chunked
		{40, false, "2", 200},  // spooled: reopenable
		{60, true, "2", 200},   // spooled, chunked
		{100, false, "1", 503}, // one-shot: not retried, the 503 relayed
		{100, true, "1", 503},  // chunked beyond the spool limit: one-shot
	}
	for i, c := range cases {
		path := fmt.Sprintf("/put/%d", i)
		body := strings.Repeat("b", c.size-1) + "!"
		var raw string
		if c.chunked {
			raw = fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n%x\r\n%s\r\n0\r\nX-Trailer: t\r\n\r\n",
				up.url(path), 7, body[:7], len(body)-7, body[7:])
		} else {
			raw = fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", up.url(path), len(body), body)
		}
		resp := rawRequest(t, p.addr, raw)
		if resp.StatusCode != c.status {
			t.Errorf("size %d chunked %v: status %d, want %d", c.size, c.chunked, resp.StatusCode, c.status)
		}
		checkEgretHeaders(t, resp, c.attempts)
		got := rec.get(path)
		want := 2
		if c.attempts == "1" {
			want = 1
		}
		if len(got) != want {
			t.Fatalf("size %d chunked %v: upstream got %d bodies, want %d", c.size, c.chunked, len(got), want)
		}
		for j, b := range got {
			if b != body {
				t.Errorf("size %d chunked %v: attempt %d body %d bytes %q..., want the %d sent", c.size, c.chunked, j+1, len(b), b[:min(len(b), 8)], len(body))
			}
		}
	}
	// Spool files are gone once requests end. Polls: they are removed as
	// each request's runner returns, after its answer, with no event.
	var ents []os.DirEntry
	if !testenv.Poll(2*time.Second, func() bool { ents, _ = os.ReadDir(spoolDir); return len(ents) == 0 }) {
		t.Fatalf("%d spool files left after the requests ended", len(ents))
	}
}

func TestOneShotBodyStreamsBeforeItEnds(t *testing.T) {
	firstBytes := make(chan string, 1)
	var total atomic.Int64
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 50)
		n, _ := io.ReadFull(r.Body, buf)
		firstBytes <- string(buf[:n])
		rest, _ := io.ReadAll(r.Body)
		total.Store(int64(n + len(rest)))
		io.WriteString(w, "streamed")
	})
	p := startProxy(t, Config{Policy: mustPolicy(t, smallBodies)})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n%s", up.url("/big"), strings.Repeat("a", 50))
	// The upstream sees the first bytes while the client still holds the
	// rest: a body over the spool limit is not read ahead.
	select {
	case b := <-firstBytes:
		if b != strings.Repeat("a", 50) {
			t.Fatalf("first bytes %q", b)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the upstream saw nothing before the client sent the whole body")
	}
	io.WriteString(c, strings.Repeat("z", 950))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if readAll(t, resp.Body) != "streamed" || total.Load() != 1000 {
		t.Fatalf("upstream got %d bytes", total.Load())
	}
}

func TestExpectContinue(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(bytes.ToUpper(b))
	})
	p := startProxy(t, Config{})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n", up.url("/"))
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("interim %q, %v", line, err)
	}
	br.ReadString('\n')
	io.WriteString(c, "hello")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp.Body); got != "HELLO" {
		t.Fatalf("body %q", got)
	}
}

func TestEarlyAnswerToOneShotBodyClosesConnection(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
	})
	p := startProxy(t, Config{Policy: mustPolicy(t, smallBodies)})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	// 50 of 1000 bytes, and the client pauses.
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n%s", up.url("/upload"), strings.Repeat("a", 50))
	start := time.Now()
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("early answer took %v", d)
	}
	if !resp.Close {
		t.Error("the answer does not say Connection: close")
	}
	io.Copy(io.Discard, resp.Body)
	// The rest of the body is still on the connection: it cannot carry
	// another request, so the proxy closes it.
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the connection stayed open with an unread body on it")
	}
}

// TestEarlyAnswerReadableWhileClientStillSends: the upstream answers a
// large one-shot upload early; the proxy relays the answer and ends the
// connection while the client is still sending. The client must get the
// answer, not a reset (the proxy closes lingering).
func TestEarlyAnswerReadableWhileClientStillSends(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
	})
	p := startProxy(t, Config{Policy: mustPolicy(t, smallBodies)})
	for i := range 10 {
		body := strings.NewReader(strings.Repeat("u", 4<<20))
		resp, err := p.client().Post(up.url("/upload"), "application/octet-stream", body)
		if err != nil {
			t.Fatalf("try %d: the answer was lost: %v", i, err)
		}
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("try %d: status %d", i, resp.StatusCode)
		}
		resp.Body.Close()
	}
}

// TestStreamedUploadKeepsTheConnection: a sized upload over the spool
// limit goes out once, streamed; once the upstream had all of it, the
// client's keep-alive connection carries the next request (the proxy
// knows the body was read to its end).
func TestStreamedUploadKeepsTheConnection(t *testing.T) {
	var got atomic.Int64
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got.Add(n)
		io.WriteString(w, "ok")
	})
	p := startProxy(t, Config{Policy: mustPolicy(t, smallBodies)})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	for i := range 2 {
		fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n%s", up.url("/up"), strings.Repeat("u", 1000))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if readAll(t, resp.Body) != "ok" || resp.Close {
			t.Fatalf("request %d: status %d, close %v", i, resp.StatusCode, resp.Close)
		}
	}
	if got.Load() != 2000 {
		t.Fatalf("upstream got %d bytes", got.Load())
	}
}
