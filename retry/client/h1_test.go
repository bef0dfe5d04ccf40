package client

import (
	"bufio"
	"errors"

	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

func roundTripBody(t *testing.T, rt http.RoundTripper, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestH1Framing: the pool reads each kind of response framing right and
// reuses a connection only when the response said where it ended and did
// not ask for a close.
func TestH1Framing(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		method    string
		body      string
		reused    bool
	}{
		{"length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "GET", "hello", true},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n", "GET", "hello", true},
		{"until close", "HTTP/1.1 200 OK\r\n\r\nhello", "GET", "hello", false},
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello", "GET", "hello", false},
		{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello", "GET", "hello", false},
		{"HEAD with length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "HEAD", "", true},
		{"no content", "HTTP/1.1 204 No Content\r\n\r\n", "GET", "", true},
		{"1xx first", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "GET", "hello", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen atomic.Int64
			srv := rawtest.AnswerEach(t, &seen, func(req *http.Request, i int) (string, bool) {
				return tc.raw, strings.Contains(tc.name, "close") || tc.name == "HTTP/1.0"
			})
			base := NewHTTPTransport(HTTPOptions{})
			defer base.CloseIdleConnections()
			for range 2 {
				req, _ := http.NewRequest(tc.method, srv.URL(), nil)
				resp, body := roundTripBody(t, base, req)
				if resp.StatusCode/100 != 2 || body != tc.body {
					t.Fatalf("status %d body %q", resp.StatusCode, body)
				}
			}
			want := int64(2)
			if tc.reused {
				want = 1
			}
			if got := srv.Conns(); got != want {
				t.Fatalf("%d connections for 2 requests, want %d", got, want)
			}
		})
	}
}

// TestH1BodyNotReadCostsTheConnection: a body closed before its end leaves
// bytes on the connection; it is not pooled.
func TestH1BodyNotReadCostsTheConnection(t *testing.T) {
	var seen atomic.Int64
	srv := rawtest.AnswerEach(t, &seen, func(*http.Request, int) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789", false
	})
	base := NewHTTPTransport(HTTPOptions{})
	defer base.CloseIdleConnections()
	resp, err := base.RoundTrip(rawtest.Get(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Read(make([]byte, 3))
	resp.Body.Close()
	roundTripBody(t, base, rawtest.Get(t, srv.URL()))
	if srv.Conns() != 2 {
		t.Fatalf("%d connections: a connection with unread body bytes was reused", srv.Conns())
	}
}

// TestH1IdleTimeout: a connection idle for longer than IdleConnTimeout is
// not reused, and the sweeper closes it without a request.
func TestH1IdleTimeout(t *testing.T) {
	var seen atomic.Int64
	closed := make(chan struct{}, 4)
	srv := rawtest.NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		for {
			if _, _, err := rawtest.ReadReq(br); err != nil {
				closed <- struct{}{}
				return
			}
			seen.Add(1)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	base := NewHTTPTransport(HTTPOptions{IdleConnTimeout: 100 * time.Millisecond})
	defer base.CloseIdleConnections()
	roundTripBody(t, base, rawtest.Get(t, srv.URL()))
	select {
	case <-closed:
	case <-time.After(2 * time.Second):
		t.Fatal("the idle connection was not closed by the sweeper")
	}
	roundTripBody(t, base, rawtest.Get(t, srv.URL()))
	if srv.Conns() != 2 {
		t.Fatalf("%d connections", srv.Conns())
	}
}

// TestH1MaxIdlePerHost: beyond MaxIdleConnsPerHost, connections that end
// their exchange are closed rather than pooled.
func TestH1MaxIdlePerHost(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 4)
	var seen atomic.Int64
	srv := rawtest.AnswerEach(t, &seen, func(*http.Request, int) (string, bool) {
		arrived <- struct{}{}
		<-release
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	base := NewHTTPTransport(HTTPOptions{MaxIdleConnsPerHost: 2})
	defer base.CloseIdleConnections()
	done := make(chan error, 4)
	for range 4 {
		go func() {
			resp, err := base.RoundTrip(rawtest.Get(t, srv.URL()))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			done <- err
		}()
	}
	// The four requests in the server's hands (each answer waits).
	timeout := time.After(10 * time.Second)
	for i := range 4 {
		select {
		case <-arrived:
		case <-timeout:
			t.Fatalf("%d of 4 requests arrived", i)
		}
	}
	close(release)
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	base.h1.mu.Lock()
	idle := len(base.h1.idle[poolKey{"http", srv.Addr()}])
	base.h1.mu.Unlock()
	if idle != 2 {
		t.Fatalf("%d idle connections, want 2", idle)
	}
}

// TestH1RequestWireFormat: what the pool writes for each kind of body.
func TestH1RequestWireFormat(t *testing.T) {
	type seenReq struct {
		cl   int64
		te   []string
		body string
		ua   string
	}
	got := make(chan seenReq, 1)
	srv := rawtest.NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		for {
			req, body, err := rawtest.ReadReq(br)
			if err != nil {
				return
			}
			got <- seenReq{req.ContentLength, req.TransferEncoding, string(body), req.Header.Get("User-Agent")}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
		}
	})
	base := NewHTTPTransport(HTTPOptions{})
	defer base.CloseIdleConnections()
	// A streamed body's last write may return the connection to the pool
	// after the response ended: each request waits for that before the
	// next, so that all of them can share one connection.
	idled := make(chan struct{}, 1)
	base.h1.idled = func() { idled <- struct{}{} }
	oneShot := func(s string) io.ReadCloser { return io.NopCloser(io.MultiReader(strings.NewReader(s))) }
	for _, tc := range []struct {
		name   string
		method string
		body   io.ReadCloser
		cl     int64
		want   seenReq
	}{
		{"POST without body", "POST", nil, 0, seenReq{cl: 0}},
		{"GET without body", "GET", nil, 0, seenReq{cl: 0}},
		{"sized in memory", "PUT", io.NopCloser(strings.NewReader("hello")), 5, seenReq{cl: 5, body: "hello"}},
		{"sized streamed", "PUT", oneShot("hello"), 5, seenReq{cl: 5, body: "hello"}},
		{"unknown length", "PUT", oneShot("hello"), -1, seenReq{cl: -1, te: []string{"chunked"}, body: "hello"}},
		{"zero length with bytes", "PUT", oneShot("hello"), 0, seenReq{cl: -1, te: []string{"chunked"}, body: "hello"}},
		{"zero length empty", "PUT", oneShot(""), 0, seenReq{cl: 0}},
		{"large sized", "PUT", oneShot(strings.Repeat("L", 40<<10)), 40 << 10, seenReq{cl: 40 << 10, body: strings.Repeat("L", 40<<10)}},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL(), nil)
		req.Body, req.ContentLength = tc.body, tc.cl
		req.Header.Set("User-Agent", "egret-test")
		roundTripBody(t, base, req)
		s := <-got
		<-idled
		tc.want.ua = "egret-test"
		if s.cl != tc.want.cl || strings.Join(s.te, ",") != strings.Join(tc.want.te, ",") || s.body != tc.want.body || s.ua != tc.want.ua {
			t.Fatalf("%s: upstream saw length %d te %v body %d bytes ua %q", tc.name, s.cl, s.te, len(s.body), s.ua)
		}
	}
	if srv.Conns() != 1 {
		t.Fatalf("%d connections for keep-alive requests", srv.Conns())
	}
	// A body shorter than its Content-Length is refused and costs the
	// connection (the upstream would wait for the rest).
	req, _ := http.NewRequest("PUT", srv.URL(), oneShot("abc"))
	req.ContentLength = 10
	if _, err := base.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "ended after 3 of its 10 bytes") {
		t.Fatalf("short body: %v", err)
	}
}

func TestCanonicalAddr(t *testing.T) {
	for in, want := range map[string]string{
		"http://example.com/":          "example.com:80",
		"https://example.com/":         "example.com:443",
		"http://example.com:8080/":     "example.com:8080",
		"http://127.0.0.1:9/":          "127.0.0.1:9",
		"http://[::1]:9/":              "[::1]:9",
		"https://[::1]/":               "[::1]:443",
		"http://[fe80::1%25eth0]:9/":   "[fe80::1%eth0]:9",
		"http://[fe80::1%25eth0]/path": "[fe80::1%eth0]:80",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := CanonicalAddr(u); got != want {
			t.Errorf("%s: %q, want %q", in, got, want)
		}
	}
}

// eofSeen is a one-shot body that records whether its end was read.
type eofSeen struct {
	r   io.Reader
	eof atomic.Bool
}

func (e *eofSeen) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.eof.Store(true)
	}
	return n, err
}

func (e *eofSeen) Close() error { return nil }

// TestH1SizedStreamedBodyReadToItsEnd: after the last byte of a sized body
// that streams (a proxy's client upload), the source is read once more and
// sees its end, so its owner knows nothing is left unread; a body longer
// than its Content-Length is refused.
func TestH1SizedStreamedBodyReadToItsEnd(t *testing.T) {
	var seen atomic.Int64
	srv := rawtest.AnswerEach(t, &seen, func(*http.Request, int) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	base := NewHTTPTransport(HTTPOptions{})
	defer base.CloseIdleConnections()
	for _, size := range []int{100, 300 << 10} {
		body := &eofSeen{r: io.MultiReader(strings.NewReader(strings.Repeat("b", size)))}
		req, _ := http.NewRequest("PUT", srv.URL(), nil)
		req.Body, req.ContentLength = body, int64(size)
		roundTripBody(t, base, req)
		if !body.eof.Load() {
			t.Fatalf("%d bytes: the body's end was never read", size)
		}
	}
	// The excess is found before the last byte leaves: the upstream never
	// has a whole request to answer (it would wait for the 10th byte).
	bodyBytes := make(chan int64, 1)
	waits := rawtest.NewServer(t, func(c net.Conn, n int) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			bodyBytes <- -1
			return
		}
		k, _ := io.Copy(io.Discard, req.Body)
		bodyBytes <- k
	})
	long := &eofSeen{r: io.MultiReader(strings.NewReader(strings.Repeat("b", 20)))}
	req, _ := http.NewRequest("PUT", waits.URL(), nil)
	req.Body, req.ContentLength = long, 10
	if _, err := base.RoundTrip(req); !errors.Is(err, ErrRequestInvalid) || !strings.Contains(err.Error(), "longer than its Content-Length") {
		t.Fatalf("long body: %v", err)
	}
	// The transport closed the connection: the upstream's read ends.
	if k := <-bodyBytes; k < 0 || k >= 10 {
		t.Fatalf("the upstream received %d of the body's 10 bytes, want fewer", k)
	}
}

// TestH1InMemoryBodyLongerThanItsLength: a small in-memory body that goes out
// with its head in one write is checked for bytes past its Content-Length
// before anything is written: refused as invalid, and not a byte of the
// request reaches the upstream (it was cut short in silence).
func TestH1InMemoryBodyLongerThanItsLength(t *testing.T) {
	var received atomic.Int64
	ended := make(chan struct{}, 1) // the first connection's end, seen by the server
	srv := rawtest.NewServer(t, func(c net.Conn, n int) {
		k, _ := io.Copy(io.Discard, c)
		received.Add(k)
		if n == 1 {
			ended <- struct{}{}
		}
	})
	base := NewHTTPTransport(HTTPOptions{})
	defer base.CloseIdleConnections()
	req, _ := http.NewRequest("PUT", srv.URL(), strings.NewReader(strings.Repeat("b", 20)))
	req.ContentLength = 10
	_, err := base.RoundTrip(req)
	if !errors.Is(err, ErrRequestInvalid) || !strings.Contains(err.Error(), "longer than its Content-Length") {
		t.Fatalf("err %v, want a request_invalid body longer than its Content-Length", err)
	}
	base.CloseIdleConnections()
	select { // the server sees the connection end
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the refused request's connection never ended")
	}
	if k := received.Load(); k != 0 {
		t.Fatalf("the upstream received %d bytes", k)
	}
	// A body of exactly its length still goes out whole.
	var seen atomic.Int64
	ok := rawtest.AnswerEach(t, &seen, func(*http.Request, int) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	req, _ = http.NewRequest("PUT", ok.URL(), strings.NewReader(strings.Repeat("b", 10)))
	if _, body := roundTripBody(t, base, req); body != "ok" || seen.Load() != 1 {
		t.Fatalf("exact body: %q, %d requests", body, seen.Load())
	}
}
