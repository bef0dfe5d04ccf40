package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/retry"
)

func TestCheckListen(t *testing.T) {
	for _, c := range []struct {
		addr  string
		allow bool
		ok    bool
	}{
		{"127.0.0.1:15001", false, true},
		{"[::1]:15001", false, true},
		{"localhost:1", false, true},
		{"127.0.0.2:1", false, true},
		{":15001", false, false},
		{"0.0.0.0:15001", false, false},
		{"[::]:15001", false, false},
		{"10.1.2.3:15001", false, false},
		{"0.0.0.0:15001", true, true},
	} {
		err := CheckListen(c.addr, c.allow)
		if (err == nil) != c.ok {
			t.Errorf("CheckListen(%q, %v) = %v", c.addr, c.allow, err)
		}
		if err != nil && c.ok == false && !errors.Is(err, ErrRemoteListen) {
			t.Errorf("CheckListen(%q): %v is not ErrRemoteListen", c.addr, err)
		}
	}
	if err := CheckListen("nonsense", false); err == nil {
		t.Error("an address without a port accepted")
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Protocol
		done bool
	}{
		{"GET / HTTP/1.1\r\n", ProtoHTTP1, true},
		{"DELETE ", ProtoHTTP1, true},
		{"GE", "", false},
		{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", ProtoHTTP2, true},
		{"PRI * HT", "", false},
		{"\x16\x03\x01\x02\x00", ProtoTLS, true},
		{"\x00\x00\x00\x08\x04\xd2\x16\x2f", ProtoPostgres, true},
		{"*1\r\n$4\r\nPING\r\n", ProtoRedis, true},
		{"\x03\x00\x00\x13", ProtoUnknown, true},
		{"get / HTTP/1.1", ProtoUnknown, true},
		{"ABCDEFGHIJKLMNOPQRSTU ", ProtoUnknown, true},
	} {
		p, done := classify([]byte(c.in))
		if p != c.want || done != c.done {
			t.Errorf("classify(%q) = %q, %v; want %q, %v", c.in, p, done, c.want, c.done)
		}
	}
}

// TestClassifyDecidesBySniffLen: sniff reads until classify decides, so
// classify must decide with sniffLen bytes whatever they are.
func TestClassifyDecidesBySniffLen(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	starts := []string{"", "PRI * HTTP/2.0\r\n", "PRI * HTTP/2.", "PRI", "GET", "ABCDEFGHIJKLMNO", "A-B_C", "\x00\x00\x00\x08"}
	for i := range 20000 {
		b := []byte(starts[i%len(starts)])
		for len(b) < sniffLen {
			if i%2 == 0 {
				b = append(b, byte(r.IntN(256)))
			} else {
				b = append(b, "AZ-_ P"[r.IntN(6)])
			}
		}
		if _, ok := classify(b[:sniffLen]); !ok {
			t.Fatalf("classify(%q) undecided", b[:sniffLen])
		}
	}
}

func TestTracesRing(t *testing.T) {
	ts := NewTraces(3)
	for _, id := range []string{"a", "b", "c", "d"} {
		ts.Put(&retryTrace{RequestID: id, Method: "GET"})
	}
	if _, ok := ts.Get("a"); ok {
		t.Error("the oldest trace survived a full ring")
	}
	for _, id := range []string{"b", "c", "d"} {
		if tr, ok := ts.Get(id); !ok || tr.RequestID != id {
			t.Errorf("trace %s: %v %v", id, tr, ok)
		}
	}
	if ts.Len() != 3 {
		t.Errorf("Len %d", ts.Len())
	}
	// A stored trace is a copy, and so is what Get gives; a slot reused
	// for a new trace does not change a copy given before.
	in := &retryTrace{RequestID: "e", Attempts: []retry.Attempt{{N: 1, Status: 503}, {N: 2, Status: 200}}}
	ts.Put(in)
	in.Attempts[0].Status = 0
	got, _ := ts.Get("e")
	if len(got.Attempts) != 2 || got.Attempts[0].Status != 503 {
		t.Fatalf("stored attempts %+v", got.Attempts)
	}
	got.Attempts[1].Status = 0
	for _, id := range []string{"f", "g", "h"} {
		ts.Put(&retryTrace{RequestID: id, Attempts: []retry.Attempt{{N: 1, Status: 418}}})
	}
	if got.Attempts[0].Status != 503 {
		t.Errorf("a copy given by Get changed when its slot was reused")
	}
	if h, _ := ts.Get("h"); len(h.Attempts) != 1 || h.Attempts[0].Status != 418 {
		t.Errorf("trace h: %+v", h.Attempts)
	}
	ts.Put(&retryTrace{RequestID: "h", Method: "PUT"})
	if h, _ := ts.Get("h"); h.Method != "PUT" || len(h.Attempts) != 0 || ts.Len() != 3 {
		t.Errorf("trace h put again: %+v, Len %d", h, ts.Len())
	}
}

func TestRequestIDOnEveryAnswer(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(HeaderRequestID) == "" {
			w.WriteHeader(http.StatusTeapot) // the upstream sees the id too
		}
	})
	p := startProxy(t, Config{})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().String()
	ln.Close()
	for _, raw := range []string{
		"GET " + up.url("/") + " HTTP/1.1\r\nHost: x\r\n\r\n",               // relayed
		"GET http://" + closed + "/ HTTP/1.1\r\nHost: x\r\n\r\n",            // not-sent
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                                 // refused
		"CONNECT " + closed + " HTTP/1.1\r\nHost: " + closed + "\r\n\r\n",   // tunnel refused
		"CONNECT " + up.addr + " HTTP/1.1\r\nHost: " + up.addr + "\r\n\r\n", // tunnel
	} {
		resp := rawRequest(t, p.addr, raw)
		if resp.StatusCode == http.StatusTeapot {
			t.Errorf("%s: the upstream got no %s", firstLine(raw), HeaderRequestID)
		}
		if id := resp.Header.Get(HeaderRequestID); len(id) != 16 {
			t.Errorf("%s: %d, %s %q", firstLine(raw), resp.StatusCode, HeaderRequestID, id)
		}
		if resp.Header.Get(HeaderAttempts) == "" {
			t.Errorf("%s: no %s", firstLine(raw), HeaderAttempts)
		}
	}
}

type policySourceFunc func() *policy.Policy

func (f policySourceFunc) Current() *policy.Policy { return f() }

func TestOverlayFollowsBase(t *testing.T) {
	base1, err := policy.Parse("node.yaml", []byte("defaults:\n  max_attempts: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	var cur atomic.Pointer[policy.Policy]
	cur.Store(base1)
	src := policySourceFunc(func() *policy.Policy { return cur.Load() })
	o, err := NewOverlay(src, "pod-a", []byte("defaults:\n  timeout: 3s\n"))
	if err != nil {
		t.Fatal(err)
	}
	u := o.Current().Match("api.example", 80)
	if u.MaxAttempts != 2 || u.Timeout != 3*time.Second {
		t.Fatalf("overlay: attempts %d timeout %v, want 2 and 3s", u.MaxAttempts, u.Timeout)
	}
	base2, err := policy.Parse("node.yaml", []byte("defaults:\n  max_attempts: 5\n"))
	if err != nil {
		t.Fatal(err)
	}
	cur.Store(base2)
	u = o.Current().Match("api.example", 80)
	if u.MaxAttempts != 5 || u.Timeout != 3*time.Second {
		t.Fatalf("after a node reload: attempts %d timeout %v, want 5 and 3s", u.MaxAttempts, u.Timeout)
	}
	if _, err := NewOverlay(src, "pod-b", []byte("defaults:\n  bulkhead: 3\n")); !errors.Is(err, policy.ErrNotOverridable) {
		t.Fatalf("a pod setting the node's bulkhead: %v, want ErrNotOverridable", err)
	}
}

func TestRequestIDs(t *testing.T) {
	seen := make(map[string]bool)
	for range 100000 {
		id := newRequestID()
		if len(id) != 16 || strings.Trim(id, "0123456789abcdef") != "" {
			t.Fatalf("id %q: want 16 lower-case hex digits", id)
		}
		if seen[id] {
			t.Fatalf("id %q given twice", id)
		}
		seen[id] = true
	}
}

// lockedBuffer is a bytes.Buffer safe for a logger and a test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRequestLogLine: one line per request, with the logger's own
// attributes, the request's fields in order, and the error when there is
// one.
func TestRequestLogLine(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	var out lockedBuffer
	log := slog.New(slog.NewTextHandler(&out, nil)).With("pod", "p1")
	p := startProxy(t, Config{Logger: log})
	resp := rawRequest(t, p.addr, "GET "+up.url("/x?q=1")+" HTTP/1.1\r\nHost: "+up.addr+"\r\n\r\n")
	id := resp.Header.Get(HeaderRequestID)
	rawRequest(t, p.addr, "GET "+up.url("/")+" HTTP/2.0\r\nHost: x\r\n\r\n")
	var lines []string
	// Polls: a line is logged after the answer is written, and the log
	// has no event to wait on.
	testenv.Poll(2*time.Second, func() bool {
		lines = lines[:0]
		for l := range strings.Lines(out.String()) {
			if strings.Contains(l, "msg=request") {
				lines = append(lines, l)
			}
		}
		return len(lines) >= 2
	})
	if len(lines) != 2 {
		t.Fatalf("request lines:\n%s", out.String())
	}
	// Each line is written after its answer: the relayed request's may
	// come after the refused one's.
	if !strings.Contains(lines[0], "id="+id) {
		lines[0], lines[1] = lines[1], lines[0]
	}
	want := regexp.MustCompile(`^time=\S+ level=INFO msg=request pod=p1 id=` + id + ` method=GET url=` +
		regexp.QuoteMeta(up.url("/x")) + ` upstream=` + regexp.QuoteMeta(up.addr) +
		` attempts=1 outcome=relayed reason=status status=200 duration=\S+\n$`)
	if !want.MatchString(lines[0]) {
		t.Errorf("relayed request's line:\n%s", lines[0])
	}
	refused := regexp.MustCompile(`^time=\S+ level=INFO msg=request pod=p1 id=[0-9a-f]{16} method="" url="" ` +
		`attempts=0 outcome=rejected reason=none status=505 duration=\S+ err="HTTP version not supported: HTTP/2.0"\n$`)
	if !refused.MatchString(lines[1]) {
		t.Errorf("refused request's line:\n%s", lines[1])
	}
}

// TestTunnelOutlivesHeadDeadline: a CONNECT whose head came in two parts
// (so that the head's read deadline was set) keeps its tunnel open past
// that deadline.
func TestTunnelOutlivesHeadDeadline(t *testing.T) {
	ln, got := echoServer(t, "")
	// 1 s, not less: the head comes in two pieces, and a loaded machine
	// may take hundreds of milliseconds between them.
	p := startProxy(t, Config{
		Timeouts: Timeouts{ReadHeaderTimeout: time.Second},
		Bounds:   Bounds{ConnectPorts: []int{ln.Addr().(*net.TCPAddr).Port}},
	})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "CONNECT "+ln.Addr().String()+" HTTP/1.1\r\n")
	time.Sleep(20 * time.Millisecond) // not synchronisation: a head in two pieces, so that its deadline is set
	io.WriteString(c, "Host: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	time.Sleep(1500 * time.Millisecond) // not synchronisation: time past the head's deadline, the test's subject
	io.WriteString(c, "ping")
	if b := <-got; string(b) != "ping" {
		t.Fatalf("destination got %q", b)
	}
	buf := make([]byte, 9)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "echo:ping" {
		t.Fatalf("through the tunnel: %q %v", buf, err)
	}
}
