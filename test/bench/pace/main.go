// Command pace is test/bench's paced load generator: C keep-alive HTTP/1.1
// connections send requests at a fixed rate R in all (open loop), and each
// request's latency runs from the time it was meant to be sent to the end
// of its answer. A connection whose previous answer came late sends at
// once, and the lateness counts: a target that falls behind is charged for
// the wait it causes, as wrk2 does it (coordinated omission).
//
//	pace -addr HOST:PORT [-path /] [-host H] [-method GET] [-body 0]
//	     [-rate 4000] [-conns 16] [-warmup 2s] [-duration 10s]
//
// Connection i sends its k-th request at t0 + (k·C + i)/R: each connection
// every C/R, the connections staggered by 1/R. Requests meant for the
// warmup are sent but not recorded; those meant for the measured window
// are. With -body N it sends N bytes of "p" (Content-Type
// application/octet-stream), as the bench's wrk script does.
//
// It prints one JSON line: requests (answers in the measured window),
// total (with the warmup's), errors (socket errors and timeouts), non2xx,
// rate (requests over the time from the window's start to the end of its
// last answer), the p50, p90, p99, p99.9 and max of the latency, and
// late_p50/late_p99, how late the generator itself woke for the sends it
// slept for (a floor in every figure), all in nanoseconds. Percentiles are
// exact (nearest rank over every sample).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/egret-proxy/egret/test/bench/internal/pacereport"
)

type config struct {
	addr, path, host, method string
	body                     int // bytes of request body
	rate                     float64
	conns                    int
	warmup, duration         time.Duration
	timeout                  time.Duration // per request, sending to end of answer
}

// report is the JSON line pace prints.
type report = pacereport.Report

func main() {
	var cfg config
	flag.StringVar(&cfg.addr, "addr", "", "`host:port` to connect to")
	flag.StringVar(&cfg.path, "path", "/", "request target")
	flag.StringVar(&cfg.host, "host", "", "Host header (default: -addr)")
	flag.StringVar(&cfg.method, "method", "GET", "request method")
	flag.IntVar(&cfg.body, "body", 0, "request body `bytes`")
	flag.Float64Var(&cfg.rate, "rate", 4000, "requests per second, all connections together")
	flag.IntVar(&cfg.conns, "conns", 16, "keep-alive connections")
	flag.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "unrecorded time before the measured window")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured window")
	flag.DurationVar(&cfg.timeout, "timeout", 5*time.Second, "longest wait for one answer (then a socket error)")
	flag.Parse()
	if cfg.host == "" {
		cfg.host = cfg.addr
	}
	// The answers' headers are garbage a few kB each: collect less often
	// than by default, so that the generator's pauses are rarer (its heap
	// stays small either way).
	debug.SetGCPercent(800)
	r, err := run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pace:", err)
		os.Exit(1)
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

// offset is the time after t0 at which connection i of conns sends its
// k-th request, at rate requests per second in all.
func offset(i, k, conns int, rate float64) time.Duration {
	return time.Duration(float64(k*conns+i) * float64(time.Second) / rate)
}

// percentile is the nearest-rank percentile of sorted for q in hundredths
// of a percent (9990: p99.9): the smallest sample with at least q/10000 of
// all samples at or below it. The rank is computed in integers, so that
// it is exact.
func percentile(sorted []time.Duration, q int) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := (q*n + 9999) / 10000 // ceil(q·n / 10000), from 1
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// request is the bytes of one request, written in one go.
func request(cfg config) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", cfg.method, cfg.path, cfg.host)
	if cfg.body > 0 || cfg.method == "POST" || cfg.method == "PUT" {
		fmt.Fprintf(&b, "Content-Type: application/octet-stream\r\nContent-Length: %d\r\n", cfg.body)
	}
	b.WriteString("\r\n")
	b.WriteString(strings.Repeat("p", cfg.body))
	return []byte(b.String())
}

// tally is what one connection saw.
type tally struct {
	lat, late       []time.Duration // measured window only
	requests, total int64
	errors, non2xx  int64
	lastEnd         time.Time // end of the last answer in the window
	firstErr        error
}

func run(cfg config) (report, error) {
	if cfg.addr == "" || cfg.rate <= 0 || cfg.conns <= 0 || cfg.duration <= 0 || cfg.warmup < 0 || cfg.body < 0 {
		return report{}, errors.New("needs -addr, a positive -rate, -conns and -duration")
	}
	if cfg.timeout <= 0 {
		cfg.timeout = 5 * time.Second
	}
	req := request(cfg)
	// All connections are open before the clock starts: dialing is not in
	// the first requests' latency.
	cs := make([]net.Conn, cfg.conns)
	for i := range cs {
		c, err := net.DialTimeout("tcp", cfg.addr, cfg.timeout)
		if err != nil {
			for _, c := range cs[:i] {
				c.Close()
			}
			return report{}, err
		}
		cs[i] = c
	}
	per := int(cfg.rate*cfg.duration.Seconds())/cfg.conns + 2
	tallies := make([]tally, cfg.conns)
	t0 := time.Now().Add(20 * time.Millisecond)
	var wg sync.WaitGroup
	for i := range cs {
		tallies[i].lat = make([]time.Duration, 0, per)
		tallies[i].late = make([]time.Duration, 0, per)
		wg.Add(1)
		go func() {
			defer wg.Done()
			drive(cfg, req, i, t0, cs[i], &tallies[i])
		}()
	}
	wg.Wait()

	var r report
	var lat, late []time.Duration
	var lastEnd time.Time
	var firstErr error
	for _, t := range tallies {
		r.Requests += t.requests
		r.Total += t.total
		r.Errors += t.errors
		r.Non2xx += t.non2xx
		lat = append(lat, t.lat...)
		late = append(late, t.late...)
		if t.lastEnd.After(lastEnd) {
			lastEnd = t.lastEnd
		}
		if firstErr == nil {
			firstErr = t.firstErr
		}
	}
	if firstErr != nil {
		fmt.Fprintf(os.Stderr, "pace: %d socket errors, the first: %v\n", r.Errors, firstErr)
	}
	if el := lastEnd.Sub(t0.Add(cfg.warmup)); r.Requests > 0 && el > 0 {
		r.Rate = float64(r.Requests) / el.Seconds()
	}
	slices.Sort(lat)
	slices.Sort(late)
	r.P50, r.P90, r.P99, r.P999 = percentile(lat, 5000), percentile(lat, 9000), percentile(lat, 9900), percentile(lat, 9990)
	r.Max = percentile(lat, 10000)
	r.LateP50, r.LateP99 = percentile(late, 5000), percentile(late, 9900)
	return r, nil
}

// drive sends connection i's requests on c at their times until the end
// of the measured window. A connection that fails is counted, closed and
// dialed again for the next request.
func drive(cfg config, req []byte, i int, t0 time.Time, c net.Conn, t *tally) {
	end := cfg.warmup + cfg.duration
	br := bufio.NewReaderSize(c, 16<<10)
	head := &http.Request{Method: cfg.method}
	fail := func(measured bool, err error) {
		if measured {
			t.errors++
			if t.firstErr == nil {
				t.firstErr = err
			}
		}
		if c != nil {
			c.Close()
			c = nil
		}
	}
	for k := 0; ; k++ {
		off := offset(i, k, cfg.conns, cfg.rate)
		if off >= end {
			break
		}
		at := t0.Add(off)
		measured := off >= cfg.warmup
		if time.Until(at) > 0 {
			sleepUntil(at)
			if measured {
				t.late = append(t.late, time.Since(at))
			}
		}
		if c == nil {
			var err error
			if c, err = net.DialTimeout("tcp", cfg.addr, cfg.timeout); err != nil {
				fail(measured, err)
				continue
			}
			br = bufio.NewReaderSize(c, 16<<10)
		}
		c.SetDeadline(time.Now().Add(cfg.timeout))
		status, closing, err := exchange(c, br, req, head)
		done := time.Now()
		if err != nil {
			fail(measured, err)
			continue
		}
		t.total++
		if measured {
			t.requests++
			t.lat = append(t.lat, done.Sub(at))
			t.lastEnd = done
			if status < 200 || status > 299 {
				t.non2xx++
			}
		}
		if closing {
			c.Close()
			c = nil
		}
	}
	if c != nil {
		c.Close()
	}
}

// exchange writes req on c and reads the whole answer, Content-Length or
// chunked. closing: the server ends the connection after it.
func exchange(c net.Conn, br *bufio.Reader, req []byte, head *http.Request) (status int, closing bool, err error) {
	if _, err := c.Write(req); err != nil {
		return 0, false, err
	}
	resp, err := http.ReadResponse(br, head)
	if err != nil {
		return 0, false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, false, fmt.Errorf("body of a %d answer: %w", resp.StatusCode, err)
	}
	return resp.StatusCode, resp.Close, nil
}
