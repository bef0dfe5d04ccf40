package main

import (
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The intended send times: each connection every C/R, and all of them
// together exactly every 1/R, each slot once.
func TestSchedule(t *testing.T) {
	const conns, rate = 4, 1000.0
	var all []time.Duration
	for i := range conns {
		for k := range 50 {
			off := offset(i, k, conns, rate)
			if k > 0 {
				if gap := off - offset(i, k-1, conns, rate); gap != 4*time.Millisecond {
					t.Fatalf("connection %d request %d: %v after the previous one, want 4ms", i, k, gap)
				}
			}
			all = append(all, off)
		}
	}
	slices.Sort(all)
	for j, off := range all {
		if want := time.Duration(j) * time.Millisecond; off != want {
			t.Fatalf("send %d at %v, want %v", j, off, want)
		}
	}
	// A rate that does not divide a second: still increasing, staggered
	// within one interval, and a window holds rate × its length.
	const conns3, rate3 = 3, 7.0
	n := 0
	for i := range conns3 {
		for k := 0; ; k++ {
			off := offset(i, k, conns3, rate3)
			if off >= 12*time.Second {
				break
			}
			if off >= 2*time.Second {
				n++
			}
		}
	}
	if n != 70 {
		t.Errorf("%d sends in a 10 s window at 7/s, want 70", n)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for v := 1; v <= 1000; v++ {
		s = append(s, time.Duration(v))
	}
	rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	slices.Sort(s)
	for _, c := range []struct {
		q    int
		want time.Duration
	}{{5000, 500}, {9000, 900}, {9900, 990}, {9990, 999}, {10000, 1000}, {1, 1}} {
		if got := percentile(s, c.q); got != c.want {
			t.Errorf("q %d of 1..1000: %d, want %d", c.q, got, c.want)
		}
	}
	// Ten samples: p50 is the fifth, p90 the ninth, p99 and p99.9 the last.
	ten := []time.Duration{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}
	for q, want := range map[int]time.Duration{5000: 50, 9000: 90, 9100: 100, 9900: 100, 9990: 100} {
		if got := percentile(ten, q); got != want {
			t.Errorf("q %d of ten: %d, want %d", q, got, want)
		}
	}
	if percentile([]time.Duration{7}, 9990) != 7 || percentile(nil, 5000) != 0 {
		t.Error("one sample or none")
	}
}

func TestRequest(t *testing.T) {
	got := string(request(config{method: "POST", path: "http://up/x", host: "up", body: 5}))
	want := "POST http://up/x HTTP/1.1\r\nHost: up\r\nContent-Type: application/octet-stream\r\nContent-Length: 5\r\n\r\nppppp"
	if got != want {
		t.Errorf("request %q, want %q", got, want)
	}
}

// The core loop on loopback at a low rate: the measured window holds
// rate × duration answers, every request is answered and read (half of
// the answers chunked), and the achieved rate is the one asked for.
func TestRunLoopback(t *testing.T) {
	var served, badBody atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b, _ := io.ReadAll(r.Body); len(b) != 4096 || r.Host != "up.example" || r.URL.Path != "/x" {
			badBody.Add(1)
		}
		if served.Add(1)%2 == 0 {
			w.Write([]byte(strings.Repeat("a", 100)))
			w.(http.Flusher).Flush() // no Content-Length: chunked
			w.Write([]byte(strings.Repeat("b", 100)))
			return
		}
		w.Header().Set("Content-Length", "64")
		w.Write([]byte(strings.Repeat("c", 64)))
	}))
	defer srv.Close()
	cfg := config{
		addr: srv.Listener.Addr().String(), path: "/x", host: "up.example", method: "POST", body: 4096,
		rate: 200, conns: 4, warmup: 200 * time.Millisecond, duration: time.Second, timeout: 5 * time.Second,
	}
	r, err := run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Non2xx != 0 || badBody.Load() != 0 {
		t.Fatalf("errors %d, non-2xx %d, bad requests %d", r.Errors, r.Non2xx, badBody.Load())
	}
	if r.Requests < 196 || r.Requests > 204 {
		t.Errorf("%d requests in the window, want 200", r.Requests)
	}
	if r.Total != served.Load() || r.Total < 236 {
		t.Errorf("%d answers read, %d served (want 240)", r.Total, served.Load())
	}
	if r.Rate < 194 || r.Rate > 206 {
		t.Errorf("achieved rate %.1f/s, want 200", r.Rate)
	}
	t.Logf("%+v", r)
	if !(0 < r.P50 && r.P50 <= r.P90 && r.P90 <= r.P99 && r.P99 <= r.P999 && r.P999 <= r.Max) {
		t.Errorf("percentiles out of order: %+v", r)
	}
}

// Non-2xx answers are counted, and a server that closes after each answer
// costs a dial, not an error.
func TestRunNon2xx(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	r, err := run(config{addr: srv.Listener.Addr().String(), path: "/", method: "GET",
		rate: 100, conns: 2, duration: 300 * time.Millisecond, timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Requests != 30 || r.Non2xx != 30 {
		t.Errorf("errors %d, requests %d, non-2xx %d; want 0, 30, 30", r.Errors, r.Requests, r.Non2xx)
	}
}

// A target that is gone is counted as errors, not as answers.
func TestRunErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		panic(http.ErrAbortHandler) // the connection is dropped, no answer
	}))
	defer srv.Close()
	r, err := run(config{addr: srv.Listener.Addr().String(), path: "/", method: "GET",
		rate: 100, conns: 2, duration: 200 * time.Millisecond, timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 0 || r.Errors != 20 {
		t.Errorf("requests %d, errors %d; want 0, 20", r.Requests, r.Errors)
	}
}
