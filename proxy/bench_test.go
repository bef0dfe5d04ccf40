package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/retry"
)

// BenchmarkKeepAliveGet: keep-alive GETs through the proxy in explicit mode.
func BenchmarkKeepAliveGet(b *testing.B) {
	benchRequests(b, "GET", "")
}

// BenchmarkKeepAlivePost4K: 4 KiB POSTs (held in memory, replayable).
func BenchmarkKeepAlivePost4K(b *testing.B) {
	benchRequests(b, "POST", strings.Repeat("p", 4096))
}

// BenchmarkKeepAliveGetDirect is the baseline: the same GETs without the
// proxy.
func BenchmarkKeepAliveGetDirect(b *testing.B) {
	up := startUpstreamB(b)
	benchOn(b, up, up, "GET", "")
}

func benchRequests(b *testing.B, method, body string) {
	up := startUpstreamB(b)
	p := startProxyB(b)
	benchOn(b, p.addr, up, method, body)
}

func benchOn(b *testing.B, addr, up, method, body string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	req := fmt.Sprintf("%s http://%s/ HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", method, up, up, len(body), body)
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for range b.N {
		if _, err := io.WriteString(c, req); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkIdleConnMemory reports the memory an idle keep-alive client
// connection costs the proxy (heap and goroutine stacks), after one request,
// once it has parked (ParkAfter 10 ms), and the goroutines it holds.
func BenchmarkIdleConnMemory(b *testing.B) {
	up := startUpstreamB(b)
	s, err := New(Config{Timeouts: Timeouts{ParkAfter: 10 * time.Millisecond}})
	if err != nil {
		b.Fatal(err)
	}
	parked := make(chan struct{}, 1)
	s.onPark = func() {
		select {
		case parked <- struct{}{}:
		default:
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(ln)
	b.Cleanup(func() { s.Shutdown(b.Context()) })
	p := &testProxy{Server: s, addr: ln.Addr().String()}
	waitParked := func(want int64) {
		for s.park != nil && s.parked.Load() != want {
			<-parked
		}
	}
	const n = 500
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	measure := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse + ms.StackInuse
	}
	// Warm the pools with one connection.
	req := fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", up, up)
	one := func() net.Conn {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			b.Fatal(err)
		}
		io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		return c
	}
	conns = append(conns, one())
	waitParked(1)
	// Measured once whatever b.N: the figure is memory, not time. The
	// client side (a net.Conn each) lives in this process too and is
	// included, so the proxy's own share is a little smaller.
	before, g0 := measure(), runtime.NumGoroutine()
	for range n {
		conns = append(conns, one())
	}
	waitParked(n + 1)
	after, g1 := measure(), runtime.NumGoroutine()
	b.ReportMetric(float64(after-before)/n, "B/idle-conn")
	b.ReportMetric(float64(g1-g0)/n, "goroutines/idle-conn")
}

func startUpstreamB(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	})}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func startProxyB(b *testing.B) *testProxy {
	s, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(ln)
	b.Cleanup(func() { s.Shutdown(b.Context()) })
	return &testProxy{Server: s, addr: ln.Addr().String()}
}

// BenchmarkProxySideGet: keep-alive GETs through the proxy with the attempt
// runner replaced by a canned response, read by a client that allocates
// nothing: what remains is the proxy's own side (head, upstream request,
// relay, metrics, logging to a discarding handler).
func BenchmarkProxySideGet(b *testing.B) {
	benchProxySide(b, slog.New(slog.DiscardHandler))
}

// BenchmarkProxySideGetLogged: the same, with the request lines formatted
// by a text handler (as `egret proxy` does) and dropped.
func BenchmarkProxySideGetLogged(b *testing.B) {
	benchProxySide(b, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// cannedRunner answers every request 200 with a two-byte body.
type cannedRunner struct{}

func (cannedRunner) Run(x *retry.Exchange) retry.Result {
	req := x.Request
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	return retry.Result{Response: &http.Response{
		Status: "200 OK", StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{
			"Content-Type":   {"text/plain; charset=utf-8"},
			"Content-Length": {"2"},
			"Date":           {"Wed, 02 Dec 2026 17:00:00 GMT"},
		},
		ContentLength: 2,
		Body:          io.NopCloser(strings.NewReader("ok")),
		Request:       req,
	}}
}

func benchProxySide(b *testing.B, log *slog.Logger) {
	// As `egret proxy` configures it.
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{Runner: cannedRunner{}, Logger: log, Shared: Shared{Metrics: m, Via: "egret"}})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(ln)
	b.Cleanup(func() { s.Shutdown(b.Context()) })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	req := []byte("GET http://upstream.example:8080/path?q=1 HTTP/1.1\r\nHost: upstream.example:8080\r\n" +
		"User-Agent: bench/1\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n")
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		if err := readCanned(br); err != nil {
			b.Fatal(err)
		}
	}
}

// readCanned reads one response with a Content-Length body, allocating
// nothing.
func readCanned(br *bufio.Reader) error {
	n := -1
	for first := true; ; first = false {
		l, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if first {
			if !bytes.HasPrefix(l, []byte("HTTP/1.1 200 ")) {
				return fmt.Errorf("status line %q", l)
			}
			continue
		}
		if len(l) <= 2 {
			break
		}
		if v, ok := bytes.CutPrefix(l, []byte("Content-Length: ")); ok {
			n = 0
			for _, d := range bytes.TrimSpace(v) {
				n = n*10 + int(d-'0')
			}
		}
	}
	if n < 0 {
		return errors.New("no Content-Length")
	}
	_, err := br.Discard(n)
	return err
}
