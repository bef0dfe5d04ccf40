package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// upstream serves 64-byte answers over HTTP/1.1 and h2c (prior knowledge)
// on one listener, as the bench's upstream does, and counts the requests
// of each protocol.
func upstream(t *testing.T, header string) (addr string, h1, h2 *atomic.Int64) {
	t.Helper()
	h1, h2 = new(atomic.Int64), new(atomic.Int64)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 {
			h2.Add(1)
		} else {
			h1.Add(1)
		}
		if header != "" {
			w.Header().Set(header, "1")
		}
		io.WriteString(w, strings.Repeat("x", 63)+"\n")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), h1, h2
}

func testConfig(addr, proto string) config {
	return config{addr: addr, host: addr, path: "/", proto: proto, conns: 2, streams: 8,
		warmup: 100 * time.Millisecond, duration: 400 * time.Millisecond, timeout: 5 * time.Second,
		wantBytes: 64, wantHeader: "Egret-Attempts", cpuPID: os.Getpid()}
}

// Both protocols carry the load they are asked for, every answer checked,
// with percentiles in order and the CPU time of the process named (this
// one, which does all the work) over the window.
func TestRun(t *testing.T) {
	for _, proto := range []string{"h2c", "http1"} {
		t.Run(proto, func(t *testing.T) {
			addr, h1, h2 := upstream(t, "Egret-Attempts")
			r, err := run(testConfig(addr, proto))
			if err != nil {
				t.Fatal(err)
			}
			if r.Requests == 0 || r.Errors != 0 || r.Bad != 0 {
				t.Fatalf("requests %d, errors %d, bad %d (%s)", r.Requests, r.Errors, r.Bad, r.FirstError)
			}
			if !(0 < r.P50 && r.P50 <= r.P90 && r.P90 <= r.P99 && r.P99 <= r.P999 && r.P999 <= r.Max) {
				t.Fatalf("percentiles out of order: %+v", r)
			}
			if r.CPU <= 0 {
				t.Fatalf("no CPU time for this process over the window: %+v", r)
			}
			got, other := h2.Load(), h1.Load()
			if proto == "http1" {
				got, other = other, got
			}
			if got < r.Requests || other != 0 {
				t.Fatalf("%s: the upstream saw %d requests in that protocol and %d in the other, for %d answers", proto, got, other, r.Requests)
			}
		})
	}
}

// Paced, every slot of the window is sent and answered, once: 16 workers
// at 1000 requests/s have 400 slots in a 400 ms window.
func TestRunPaced(t *testing.T) {
	for _, proto := range []string{"h2c", "http1"} {
		t.Run(proto, func(t *testing.T) {
			addr, _, _ := upstream(t, "Egret-Attempts")
			cfg := testConfig(addr, proto)
			cfg.rate = 1000
			r, err := run(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if r.Requests != 400 || r.Errors != 0 || r.Bad != 0 {
				t.Fatalf("requests %d, errors %d, bad %d (%s), want 400 answered", r.Requests, r.Errors, r.Bad, r.FirstError)
			}
			if r.P50 <= 0 || r.P99 < r.P50 || r.LateP99 < r.LateP50 {
				t.Fatalf("percentiles out of order: %+v", r)
			}
		})
	}
}

// A target whose answers lack the header asked for (egret not in the way)
// fails the run at its first request, saying so.
func TestRunFailsWithoutHeader(t *testing.T) {
	for _, proto := range []string{"h2c", "http1"} {
		t.Run(proto, func(t *testing.T) {
			addr, _, _ := upstream(t, "")
			_, err := run(testConfig(addr, proto))
			if err == nil || !strings.Contains(err.Error(), "first request on connection 0: answer without Egret-Attempts") {
				t.Fatalf("err = %v, want the first request's answer without Egret-Attempts", err)
			}
		})
	}
}
