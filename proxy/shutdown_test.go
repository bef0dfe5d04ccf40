package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// lines collects the proxy's request log lines.
type lines struct {
	mu  sync.Mutex
	out []map[string]string
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lines) WithGroup(string) slog.Handler            { return l }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "request" {
		return nil
	}
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	l.out = append(l.out, m)
	l.mu.Unlock()
	return nil
}

func (l *lines) byOutcome() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[string]int{}
	for _, m := range l.out {
		n[m["outcome"]]++
	}
	return n
}

// TestShutdownPastGraceAnswersEveryRequest is the attack of an exhausted
// grace: 200 requests in flight that have reached the upstream (which never
// answers), a POST body still being sent, and a GET in flight, when
// Shutdown's grace is over. Every one must be answered with the truth and
// logged; before, most got a bare EOF and no line.
func TestShutdownPastGraceAnswersEveryRequest(t *testing.T) {
	const n = 200
	release := make(chan struct{})
	var arrived atomic.Int64
	all := make(chan struct{})
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if arrived.Add(1) == n+1 {
			close(all)
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	log := &lines{}
	s, err := New(Config{Policy: mustPolicy(t, windowsPolicy), Logger: slog.New(log), Timeouts: Timeouts{AnswerGrace: testAnswerGrace}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	addr := ln.Addr().String()

	type result struct {
		status  int
		outcome string
		err     error
	}
	send := func(raw string) result {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return result{err: err}
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Minute)) // only a broken test's
		if _, err := io.WriteString(c, raw); err != nil {
			return result{err: err}
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return result{err: err}
		}
		io.Copy(io.Discard, resp.Body)
		return result{status: resp.StatusCode, outcome: resp.Header.Get(HeaderOutcome)}
	}
	results := make(chan result, n+2)
	for i := range n {
		go func() {
			results <- send(fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\n\r\npay=%d", up.url("/pay"), up.addr, i%10))
		}()
	}
	go func() {
		results <- send(fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", up.url("/get"), up.addr))
	}()
	// A POST whose body is still on its way (5 of 100 bytes sent).
	go func() {
		results <- send(fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 100\r\n\r\nhello", up.url("/slow"), up.addr))
	}()
	select {
	case <-all:
	case <-time.After(2 * time.Minute):
		t.Fatalf("only %d requests reached the upstream", arrived.Load())
	}
	// Every connection active: woken by the server's changes of state.
	giveUp := time.NewTimer(2 * time.Minute)
	defer giveUp.Stop()
	for active := 0; active != n+2; {
		s.mu.Lock()
		active = 0
		for c := range s.conns {
			if c.state == stateActive {
				active++
			}
		}
		s.mu.Unlock()
		if active == n+2 {
			break
		}
		select {
		case <-s.changed:
		case <-giveUp.C:
			t.Fatalf("%d of %d connections active", active, n+2)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the grace is exhausted
	if err := s.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown with an exhausted grace returned nil")
	}
	got := map[string]int{}
	for range n + 2 {
		r := <-results
		if r.err != nil {
			got["error: "+r.err.Error()]++
			continue
		}
		got[fmt.Sprintf("%d %s", r.status, r.outcome)]++
	}
	want := map[string]int{"502 ambiguous": n, "502 failed": 1, "503 not-sent": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("answers %v, want %v", got, want)
	}
	wantLog := map[string]int{"ambiguous": n, "failed": 1, "not-sent": 1}
	if l := log.byOutcome(); fmt.Sprint(l) != fmt.Sprint(wantLog) {
		t.Errorf("log lines by outcome %v, want %v", l, wantLog)
	}
	t.Logf("answers after an exhausted grace: %v; log lines: %v", got, log.byOutcome())
}

// TestShutdownPastGraceCutsAStartedBody: a response whose body has begun
// cannot be answered again; its connection is cut (a reset, never a clean
// end), and the request is logged.
func TestShutdownPastGraceCutsAStartedBody(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, "first part")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	log := &lines{}
	p := startProxy(t, Config{Logger: slog.New(log), Timeouts: Timeouts{AnswerGrace: testAnswerGrace}})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Minute)) // only a broken test's
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", up.url("/"))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.Shutdown(ctx)
	rest, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("a cut body ended cleanly after %q", rest)
	}
	// Logged before its connection ended, so before Shutdown returned.
	if l := log.byOutcome(); l["relayed"] != 1 || len(l) != 1 {
		t.Errorf("log lines by outcome %v, want the request's", l)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what, cond)
}
