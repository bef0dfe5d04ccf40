package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// h2cUpstream serves h with net/http's HTTP/2 server, prior knowledge over
// cleartext, on loopback.
func h2cUpstream(t *testing.T, h http.HandlerFunc) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, Protocols: h2cProtocols}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln
}

// h2cClient speaks HTTP/2 with prior knowledge to whatever address it
// dials (the proxy, which takes the upstream for the original
// destination).
func h2cClient(addr string) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{
		Protocols: &p,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
	}, Timeout: 10 * time.Second}
}

// A GET over h2c from a pod is forwarded upstream over h2c and retried
// after a 503, as on HTTP/1.1: the client gets the second answer, with
// egret's fields, the upstream's trailers and the protocol it spoke.
func TestH2CRetriesAStream(t *testing.T) {
	var n atomic.Int32
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			t.Errorf("upstream got %s, want HTTP/2", r.Proto)
		}
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Trailer", "X-Sum")
		io.WriteString(w, "ok "+r.URL.Path)
		w.Header().Set("X-Sum", "42")
	})
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: addrPortOf(t, up)}})
	resp, err := h2cClient(p.addr).Get("http://svc.example/a")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 || string(body) != "ok /a" {
		t.Fatalf("got %s %d %q", resp.Proto, resp.StatusCode, body)
	}
	if got := resp.Header.Get(HeaderAttempts); got != "2" {
		t.Fatalf("Egret-Attempts %q, want 2", got)
	}
	if resp.Header.Get(HeaderRequestID) == "" {
		t.Fatal("no Egret-Request-Id")
	}
	if got := resp.Trailer.Get("X-Sum"); got != "42" {
		t.Fatalf("trailer X-Sum %q", got)
	}
	if n.Load() != 2 {
		t.Fatalf("upstream saw %d requests, want 2", n.Load())
	}
}

// A POST whose upstream stream is reset after the request was read is
// not retried and is answered ambiguous; a gRPC call gets that as
// Trailers-Only with grpc-status UNKNOWN.
func TestH2CResetAfterReadIsAmbiguous(t *testing.T) {
	var n atomic.Int32
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		n.Add(1)
		panic(http.ErrAbortHandler) // RST_STREAM after the whole request was read
	})
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: addrPortOf(t, up)}})
	c := h2cClient(p.addr)
	for _, grpc := range []bool{false, true} {
		n.Store(0)
		req, _ := http.NewRequest(http.MethodPost, "http://svc.example/pkg.S/M", strings.NewReader("call"))
		if grpc {
			req.Header.Set("Content-Type", "application/grpc")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := resp.Header.Get(HeaderOutcome); got != "ambiguous" {
			t.Fatalf("grpc=%v: Egret-Outcome %q, want ambiguous (status %d)", grpc, got, resp.StatusCode)
		}
		if n.Load() != 1 {
			t.Fatalf("grpc=%v: upstream ran it %d times", grpc, n.Load())
		}
		if !grpc {
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d, want 502", resp.StatusCode)
			}
			continue
		}
		if resp.StatusCode != 200 || resp.Header.Get("Grpc-Status") != "2" ||
			!strings.Contains(resp.Header.Get("Grpc-Message"), "ambiguous") {
			t.Fatalf("gRPC answer %d grpc-status %q grpc-message %q", resp.StatusCode,
				resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message"))
		}
	}
}

// Shutdown tells an HTTP/2 client GOAWAY; a stream in flight is still
// answered, and the connection ends after it.
func TestH2CShutdownGoAway(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "late")
	})
	s, err := New(Config{Mode: Transparent, Resolver: &StaticResolver{Dst: addrPortOf(t, up)}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	c := h2cClient(ln.Addr().String())
	got := make(chan string, 1)
	go func() {
		resp, err := c.Get("http://svc.example/slow")
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- string(b)
	}()
	<-arrived
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	close(release)
	if b := <-got; b != "late" {
		t.Fatalf("stream in flight at shutdown got %q", b)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// A gRPC call answered Trailers-Only UNAVAILABLE is retried only where
// the policy declares its method idempotent (a gRPC call is a POST); a
// RESOURCE_EXHAUSTED whose pushback is negative never is.
func TestH2CGRPCStatusRules(t *testing.T) {
	var n atomic.Int32
	var first atomic.Value // the grpc-status of each call's first answer
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/grpc")
		if n.Add(1) == 1 {
			code := first.Load().(string)
			w.Header().Set("Grpc-Status", code)
			if code == "8" {
				w.Header().Set("Grpc-Retry-Pushback-Ms", "-1")
			}
			w.WriteHeader(http.StatusOK) // Trailers-Only
			return
		}
		w.Header().Set("Trailer", "Grpc-Status")
		w.Write([]byte{0, 0, 0, 0, 0})
		w.Header().Set("Grpc-Status", "0")
	})
	pol := mustPolicy(t, "defaults:\n  backoff: {kind: full, base: 1ms, max: 1ms}\n  routes:\n    - {method: POST, path_prefix: /pkg.Idem/, idempotent: true}\n")
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: addrPortOf(t, up)}, Policy: pol})
	c := h2cClient(p.addr)
	for _, tc := range []struct {
		path, code, wantStatus, wantAttempts string
	}{
		{"/pkg.Other/M", "14", "14", "1"},
		{"/pkg.Idem/M", "14", "0", "2"},
		{"/pkg.Idem/M", "8", "8", "1"},
	} {
		n.Store(0)
		first.Store(tc.code)
		req, _ := http.NewRequest(http.MethodPost, "http://svc.example"+tc.path, strings.NewReader("\x00\x00\x00\x00\x00"))
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got := resp.Header.Get("Grpc-Status")
		if got == "" {
			got = resp.Trailer.Get("Grpc-Status")
		}
		if got != tc.wantStatus || resp.Header.Get(HeaderAttempts) != tc.wantAttempts {
			t.Errorf("%s first answer %s: grpc-status %q, attempts %q; want %q, %q", tc.path, tc.code,
				got, resp.Header.Get(HeaderAttempts), tc.wantStatus, tc.wantAttempts)
		}
	}
}

// A stream's body goes upstream as it comes: a client that waits for the
// first part of the answer before it sends the rest (a gRPC call
// streaming both ways) is served, not held until its body ends.
func TestH2CStreamsBothWays(t *testing.T) {
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		w.WriteHeader(http.StatusOK)
		rc.Flush()
		buf := make([]byte, 64)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				w.Write([]byte("echo " + string(buf[:n]) + ";"))
				rc.Flush()
			}
			if err != nil {
				return
			}
		}
	})
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: addrPortOf(t, up)}})
	pr, pw := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, "http://svc.example/chat", pr)
	req.Header.Set("Content-Type", "application/grpc")
	go pw.Write([]byte("ping"))
	resp, err := h2cClient(p.addr).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	want := "echo ping;"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != want {
		t.Fatalf("first answer %q, %v", got, err)
	}
	pw.Write([]byte("pong"))
	pw.Close()
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "echo pong;" {
		t.Fatalf("rest %q, %v", rest, err)
	}
	if resp.Header.Get(HeaderAttempts) != "1" {
		t.Fatalf("attempts %q", resp.Header.Get(HeaderAttempts))
	}
}

// A client's RST_STREAM ends its stream's attempt upstream: the upstream
// sees its request's context end.
func TestH2CClientResetCancelsAttempt(t *testing.T) {
	arrived, gone := make(chan struct{}), make(chan struct{})
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done()
		close(gone)
	})
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: addrPortOf(t, up)}})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://svc.example/slow", nil)
	errc := make(chan error, 1)
	go func() {
		_, err := h2cClient(p.addr).Do(req)
		errc <- err
	}()
	<-arrived
	cancel() // the client resets the stream
	<-gone
	if err := <-errc; err == nil {
		t.Fatal("a cancelled request got an answer")
	}
}
