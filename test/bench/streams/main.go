// Command streams is test/bench's load generator for many concurrent
// requests on few connections: with -proto h2c it opens C cleartext HTTP/2
// connections (prior knowledge, as gRPC clients do between pods) and keeps
// S streams in flight on each; with -proto http1 it keeps the same C·S
// requests in flight on C·S keep-alive HTTP/1.1 connections, one each, the
// most HTTP/1.1 can do with as many requests outstanding. Closed loop by
// default: each of the C·S workers sends its next GET when the previous
// answer has ended, and an answer counts if it ends in the measured window.
// With -rate R, paced (open loop), as test/bench/pace: worker i sends its
// k-th GET at t0 + (k·C·S + i)/R, and the latency runs from that time, a
// worker held up by a slow answer sending late and the lateness counting
// (coordinated omission); a request counts if its time is in the window.
//
//	streams -addr HOST:PORT [-proto h2c|http1] [-conns 4] [-streams 16]
//	        [-rate 0] [-path /] [-host H] [-warmup 2s] [-duration 5s]
//	        [-want-bytes 64] [-want-header NAME] [-cpu-pid PID | -cpu-parent]
//
// Why not h2load (nghttp2): it reports the mean and spread of its request
// times, no percentiles, and the bench compares p99. This one records every
// request's latency in the measured window (exact nearest-rank
// percentiles), checks every answer (status 200, -want-bytes of body, and
// -want-header present: the bench requires egret's Egret-Attempts, so that
// a run that did not go through egret fails instead of measuring the
// upstream alone), and reads the CPU time of the target's process at the
// window's start and end itself (-cpu-pid, or -cpu-parent when it is run
// as `egret run -- streams ...`, whose process is the proxy), so that a
// proxy started for the run is charged for the window only.
//
// Before the warmup one request on each connection must be answered as
// checked; otherwise it prints {"error": ...} and exits 1. It prints one
// JSON line (test/bench/internal/streamsreport): requests answered in the
// window, errors, bad answers, rate, p50, p90, p99, p99.9, max, how late
// the generator woke for paced sends, and the target's CPU time over the
// window.
package main

import (
	"bufio"
	"context"
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
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"

	"github.com/egret-proxy/egret/test/bench/internal/streamsreport"
)

type config struct {
	addr, path, host string
	proto            string // "h2c" or "http1"
	conns, streams   int
	warmup, duration time.Duration
	timeout          time.Duration // per request
	wantBytes        int           // -1: any
	wantHeader       string        // "": none
	cpuPID           int           // 0: none
	rate             float64       // requests/s in all (0: closed loop)
}

func main() {
	var cfg config
	var cpuParent bool
	flag.StringVar(&cfg.addr, "addr", "", "`host:port` to connect to")
	flag.StringVar(&cfg.proto, "proto", "h2c", "h2c (HTTP/2 with prior knowledge) or http1")
	flag.IntVar(&cfg.conns, "conns", 4, "connections (h2c); http1 opens conns × streams")
	flag.IntVar(&cfg.streams, "streams", 16, "concurrent streams on each connection (h2c); requests in flight are conns × streams either way")
	flag.StringVar(&cfg.path, "path", "/", "request path")
	flag.StringVar(&cfg.host, "host", "", "Host / :authority (default: -addr)")
	flag.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "unrecorded time before the measured window")
	flag.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured window")
	flag.DurationVar(&cfg.timeout, "timeout", 5*time.Second, "longest wait for one answer (then an error)")
	flag.IntVar(&cfg.wantBytes, "want-bytes", -1, "body length every answer must have (-1: any)")
	flag.StringVar(&cfg.wantHeader, "want-header", "", "header every answer must carry")
	flag.Float64Var(&cfg.rate, "rate", 0, "requests per second in all, paced (0: closed loop)")
	flag.IntVar(&cfg.cpuPID, "cpu-pid", 0, "process whose CPU time over the window is reported (0: none)")
	flag.BoolVar(&cpuParent, "cpu-parent", false, "report the CPU time of this process's parent (run under `egret run`)")
	flag.Parse()
	if cfg.host == "" {
		cfg.host = cfg.addr
	}
	if cpuParent {
		cfg.cpuPID = os.Getppid()
	}
	// Answers are garbage of a few hundred bytes each: collect less often,
	// so that the generator's pauses are rarer.
	debug.SetGCPercent(800)
	r, err := run(cfg)
	if err != nil {
		r = streamsreport.Report{Error: err.Error()}
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	if err != nil {
		os.Exit(1)
	}
}

// client sends one request and returns its status and what it read, or
// why it could not.
type client interface {
	do(ctx context.Context) error
	close()
}

// badAnswer is an answer that arrived but is not the one checked for.
type badAnswer struct{ msg string }

func (b *badAnswer) Error() string { return b.msg }

func run(cfg config) (streamsreport.Report, error) {
	var r streamsreport.Report
	if cfg.addr == "" || cfg.conns <= 0 || cfg.streams <= 0 {
		return r, errors.New("-addr, and positive -conns and -streams, are needed")
	}
	var clients []client // one per worker
	defer func() {
		for _, c := range clients {
			c.close()
		}
	}()
	switch cfg.proto {
	case "h2c":
		tr := &http2.Transport{AllowHTTP: true}
		for range cfg.conns {
			nc, err := net.DialTimeout("tcp", cfg.addr, cfg.timeout)
			if err != nil {
				return r, err
			}
			cc, err := tr.NewClientConn(nc)
			if err != nil {
				nc.Close()
				return r, err
			}
			h := &h2client{cfg: &cfg, cc: cc}
			for range cfg.streams {
				clients = append(clients, h)
			}
		}
	case "http1":
		for range cfg.conns * cfg.streams {
			nc, err := net.DialTimeout("tcp", cfg.addr, cfg.timeout)
			if err != nil {
				return r, err
			}
			clients = append(clients, &h1client{cfg: &cfg, c: nc, br: bufio.NewReader(nc),
				req: []byte(fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", cfg.path, cfg.host))})
		}
	default:
		return r, fmt.Errorf("-proto %q: expected h2c or http1", cfg.proto)
	}
	// Each connection answers one request as checked before the load
	// starts: a target that is not what the bench means to measure fails
	// here, with the reason.
	step := cfg.streams // h2c: the first stream slot of each connection
	if cfg.proto == "http1" {
		step = 1 // every client is a connection
	}
	for i := 0; i < len(clients); i += step {
		if err := clients[i].do(context.Background()); err != nil {
			return r, fmt.Errorf("first request on connection %d: %w", i/step, err)
		}
	}

	// The clock starts once every connection is open and checked.
	t0 := time.Now().Add(20 * time.Millisecond)
	start, end := t0.Add(cfg.warmup), t0.Add(cfg.warmup+cfg.duration)
	type worker struct {
		lat, late   []time.Duration // the measured window's
		errors, bad int64
		first       error
		last        time.Time // end of the last answer counted
	}
	ws := make([]worker, len(clients))
	var cpu0, cpu1 time.Duration
	var cpuErr error
	var wg sync.WaitGroup
	// The CPU readings at the window's edges, on their own goroutine so
	// that no worker waits for them.
	wg.Go(func() {
		if cfg.cpuPID == 0 {
			return
		}
		time.Sleep(time.Until(start))
		if cpu0, cpuErr = cpuTime(cfg.cpuPID); cpuErr != nil {
			return
		}
		time.Sleep(time.Until(end))
		cpu1, cpuErr = cpuTime(cfg.cpuPID)
	})
	for i, c := range clients {
		w := &ws[i]
		w.lat = make([]time.Duration, 0, 1<<14)
		wg.Go(func() {
			for k := 0; ; k++ {
				// at: when the request is meant to be sent. Closed loop:
				// now, and it counts if its answer ends in the window.
				// Paced: worker i's k-th slot, and it counts if the slot
				// is in the window, its lateness included.
				var at time.Time
				if cfg.rate > 0 {
					at = t0.Add(slot(i, k, len(clients), cfg.rate))
					if !at.Before(end) {
						return
					}
					if time.Until(at) > 0 {
						sleepUntil(at)
						if !at.Before(start) {
							w.late = append(w.late, time.Since(at))
						}
					}
				} else if at = time.Now(); !at.Before(end) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
				err := c.do(ctx)
				cancel()
				done := time.Now()
				if cfg.rate > 0 && at.Before(start) || cfg.rate <= 0 && (done.Before(start) || done.After(end)) {
					continue // the warmup's, or ended after the window
				}
				var bad *badAnswer
				switch {
				case err == nil:
					w.lat = append(w.lat, done.Sub(at))
					w.last = done
				case errors.As(err, &bad):
					w.bad++
				default:
					w.errors++
				}
				if err != nil && w.first == nil {
					w.first = err
				}
			}
		})
	}
	wg.Wait()
	if cpuErr != nil {
		return r, fmt.Errorf("CPU time of pid %d: %w", cfg.cpuPID, cpuErr)
	}

	var all, late []time.Duration
	var last time.Time
	for _, w := range ws {
		all = append(all, w.lat...)
		late = append(late, w.late...)
		r.Errors += w.errors
		r.Bad += w.bad
		if w.last.After(last) {
			last = w.last
		}
		if w.first != nil && r.FirstError == "" {
			r.FirstError = w.first.Error()
		}
	}
	slices.Sort(all)
	r.Requests = int64(len(all))
	r.CPU = cpu1 - cpu0
	if len(all) == 0 {
		return r, fmt.Errorf("no answer in the measured window (%d errors, %d bad answers; first: %s)", r.Errors, r.Bad, r.FirstError)
	}
	r.Rate = float64(len(all)) / cfg.duration.Seconds()
	if cfg.rate > 0 {
		// Paced, the window's last answers may end after it.
		r.Rate = float64(len(all)) / max(last.Sub(start), cfg.duration).Seconds()
	}
	slices.Sort(late)
	r.P50, r.P90, r.P99, r.P999, r.Max = percentile(all, 5000), percentile(all, 9000), percentile(all, 9900), percentile(all, 9990), percentile(all, 10000)
	r.LateP50, r.LateP99 = percentile(late, 5000), percentile(late, 9900)
	return r, nil
}

// slot is the time after t0 at which worker i of n sends its k-th request
// at rate requests per second in all: each worker every n/rate, the
// workers staggered by 1/rate.
func slot(i, k, n int, rate float64) time.Duration {
	return time.Duration(float64(k*n+i) * float64(time.Second) / rate)
}

// percentile is the nearest-rank percentile of sorted for q in hundredths
// of a percent (9990: p99.9), computed in integers so that it is exact (0
// for no samples).
func percentile(sorted []time.Duration, q int) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := (q*n + 9999) / 10000 // ceil(q·n / 10000), from 1
	return sorted[min(max(rank, 1), n)-1]
}

// check is the answer's verdict: nil if it is the one the bench wants.
func check(cfg *config, status int, h http.Header, n int64) error {
	if status != http.StatusOK {
		return &badAnswer{fmt.Sprintf("answer %d, want 200", status)}
	}
	if cfg.wantBytes >= 0 && n != int64(cfg.wantBytes) {
		return &badAnswer{fmt.Sprintf("answer of %d bytes, want %d", n, cfg.wantBytes)}
	}
	if cfg.wantHeader != "" && h.Get(cfg.wantHeader) == "" {
		return &badAnswer{fmt.Sprintf("answer without %s", cfg.wantHeader)}
	}
	return nil
}

// h2client is one stream slot on an HTTP/2 connection; the S slots of a
// connection share its ClientConn, which multiplexes them.
type h2client struct {
	cfg *config
	cc  *http2.ClientConn
}

func (h *h2client) do(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.cfg.host+h.cfg.path, nil)
	if err != nil {
		return err
	}
	resp, err := h.cc.RoundTrip(req)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.ProtoMajor != 2 {
		return &badAnswer{fmt.Sprintf("answer in %s, want HTTP/2", resp.Proto)}
	}
	return check(h.cfg, resp.StatusCode, resp.Header, n)
}

func (h *h2client) close() { h.cc.Close() }

// h1client is one keep-alive HTTP/1.1 connection, one request at a time.
type h1client struct {
	cfg *config
	c   net.Conn
	br  *bufio.Reader
	req []byte
}

func (h *h1client) do(ctx context.Context) error {
	if dl, ok := ctx.Deadline(); ok {
		h.c.SetDeadline(dl)
	}
	if _, err := h.c.Write(h.req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(h.br, nil)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.Close {
		return errors.New("the target closed the keep-alive connection")
	}
	return check(h.cfg, resp.StatusCode, resp.Header, n)
}

func (h *h1client) close() { h.c.Close() }

// cpuTime is the user + system CPU time pid has used, from /proc/PID/stat
// (clock ticks of 10 ms).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from its ")".
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
