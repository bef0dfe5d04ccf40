// Command bench measures egret against a direct connection, HAProxy and
// Caddy on loopback, in one run: the memory each idle keep-alive client
// connection costs every proxy, then keep-alive GETs and 4 KiB POSTs driven
// by wrk, with the CPU time each proxy spends per request.
//
//	go run ./test/bench [-duration 10s] [-conns 32] [-threads 2] [-idle 2000]
//
// Not part of CI. It needs wrk, haproxy and caddy (Debian's packages) on
// PATH or given by flag; it builds egret itself from this module. Caddy
// (reverse_proxy, lb_retries 2) is the Go peer: a full proxy written in Go,
// where go-relay is the least one.
//
// Two baselines are measured beside them (-baselines=false leaves them
// out): haproxy+log, HAProxy writing one log line per request as egret
// does, and go-relay (test/bench/relay), the least a goroutine-per-
// connection Go program does to carry the same requests, which tells
// egret's own cost from that of Go's runtime and the kernel on this
// machine. The targets of issue 3 are against plain haproxy.
//
// Why wrk: it is C on epoll and spends little CPU per request, so on a small
// machine the load generator takes as little as possible from the proxies
// under test, and the same generator measures all targets the same way
// (closed loop, keep-alive, its own latency histogram).
//
// At saturation latency is queueing: the direct run's p99 is above the
// proxies'. So latency is measured again at one fixed rate for all targets
// (-rate, -pace-conns; -paced=false leaves it out) by test/bench/pace, an
// open-loop generator in its own process that counts each request's
// latency from the time it was meant to be sent (coordinated omission):
// what a proxy adds is then its p50 or p99 less the direct run's.
//
// Last (-h2=false leaves it out), GETs with many requests in flight on few
// HTTP/2 connections (h2c, prior knowledge), beside the same number on
// HTTP/1.1 connections, driven by test/bench/streams against the same
// upstream: direct, HAProxy (proto h2 on its bind line; h2 or HTTP/1.1 to
// the upstream) and egret in transparent mode, the only one in which it
// serves h2c: the generator runs as `egret run -- streams ...` (root), and
// every answer must carry Egret-Attempts. Closed loop, then paced at
// -h2-rate; see h2.go.
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
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/egret-proxy/egret/test/bench/internal/pacereport"
)

var (
	duration = flag.Duration("duration", 10*time.Second, "length of each measured wrk run")
	warmup   = flag.Duration("warmup", 2*time.Second, "length of the unmeasured run before each target's first wrk measurement, and of the unrecorded start of each paced run")
	conns    = flag.Int("conns", 32, "wrk connections")
	threads  = flag.Int("threads", 2, "wrk threads")
	rounds   = flag.Int("rounds", 1, "measured runs per target and workload (the median is reported)")
	idleN    = flag.Int("idle", 2000, "idle keep-alive connections opened for the memory measurement (0: skip)")
	settleD  = flag.Duration("idle-settle", 1500*time.Millisecond, "how long the memory measurement lets a target settle, twice before each reading (a collection after each wait)")
	wrkBin   = flag.String("wrk", "wrk", "wrk binary")
	haproxy  = flag.String("haproxy", "/usr/sbin/haproxy", "haproxy binary")
	caddyBin = flag.String("caddy", "caddy", "caddy binary")
	egretBin = flag.String("egret", "", "egret binary (default: go build ./cmd/egret)")
	keep     = flag.Bool("keep", false, "keep the work directory (configs, logs)")
	profile  = flag.String("profile", "", "write a CPU profile of egret during its first measured GET run to `FILE`")
	extra    = flag.Bool("baselines", true, "also measure HAProxy and Caddy logging each request (haproxy+log, caddy+log) and a bare Go relay (go-relay)")
	rate     = flag.Float64("rate", 4000, "requests per second of the paced runs")
	paceN    = flag.Int("pace-conns", 16, "connections of the paced runs")
	paced    = flag.Bool("paced", true, "after the wrk runs, measure latency at the fixed rate -rate (test/bench/pace)")
	saturate = flag.Bool("saturate", true, "measure throughput at saturation with wrk (-saturate=false: the paced runs alone)")
	h2       = flag.Bool("h2", true, "last, measure GETs on h2c connections beside HTTP/1.1 (test/bench/streams): direct, HAProxy (proto h2) and egret run (transparent)")
	h2Conns  = flag.Int("h2-conns", 4, "h2c connections of the h2c section")
	h2Stream = flag.Int("h2-streams", 16, "concurrent streams on each h2c connection (HTTP/1.1: h2-conns × h2-streams connections)")
	h2Rate   = flag.Float64("h2-rate", 2000, "requests per second of the h2c section's paced runs, after its closed-loop ones (0: none)")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// result is one wrk run.
type result struct {
	rps      float64
	requests int64
	p50, p99 time.Duration
	non2xx   int
	errors   int
	// cpu is the CPU time (user + system) the target's process spent per
	// request (0: no process of its own, i.e. direct); sys is its
	// system part.
	cpu, sys time.Duration
}

// workload is one kind of request: a wrk script and pace's flags for it.
type workload struct {
	name   string
	lua    string
	method string
	body   int
}

type target struct {
	name string
	addr string // host:port wrk connects to
	path string // request target wrk sends (absolute-form for egret)
	pid  int    // process to measure (0: none)
	// goStats is the address serving the target's Go runtime figures on
	// /metrics and a collection on /debug/pprof/heap?gc=1 (egret's
	// --metrics, Caddy's admin endpoint); "" for none.
	goStats string
}

func run() error {
	if !*saturate && !*paced && !*h2 && *idleN <= 0 {
		return errors.New("-saturate=false, -paced=false, -h2=false and -idle 0 leave nothing to measure")
	}
	if err := raiseFileLimit(*idleN); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "egret-bench-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Println("work directory:", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	for _, b := range []string{*wrkBin, *haproxy, *caddyBin} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("%s not found: %w", b, err)
		}
	}

	// The upstream: a plain net/http server in this process, answering 64
	// bytes after reading the whole request body; HTTP/1.1 and h2c (prior
	// knowledge) on the same port, for the h2c section.
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	payload := []byte(strings.Repeat("x", 63) + "\n")
	var upProtos http.Protocols
	upProtos.SetHTTP1(true)
	upProtos.SetUnencryptedHTTP2(true)
	upSrv := &http.Server{Protocols: &upProtos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", strconv.Itoa(len(payload)))
		w.Write(payload)
	}), ReadHeaderTimeout: 10 * time.Second}
	go upSrv.Serve(up)
	defer upSrv.Close()
	upAddr := up.Addr().String()

	egret := *egretBin
	if egret == "" {
		egret = filepath.Join(dir, "egret")
		fmt.Println("building egret...")
		cmd := exec.Command("go", "build", "-o", egret, "github.com/egret-proxy/egret/cmd/egret")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build: %w", err)
		}
	}
	var streamsBin string
	if *h2 {
		if *h2Conns <= 0 || *h2Stream <= 0 {
			return errors.New("-h2-conns and -h2-streams must be positive")
		}
		if streamsBin, err = goBuild(dir, "streams"); err != nil {
			return err
		}
	}
	var paceBin string
	if *paced {
		if *rate <= 0 || *paceN <= 0 {
			return errors.New("-rate and -pace-conns must be positive")
		}
		if paceBin, err = goBuild(dir, "pace"); err != nil {
			return err
		}
	}

	egretAddr, metricsAddr := freeAddr(), freeAddr()
	egretLog, err := os.Create(filepath.Join(dir, "egret.log"))
	if err != nil {
		return err
	}
	defer egretLog.Close()
	// Embedded defaults: 3 attempts, the counterpart of HAProxy's retries 2.
	eg := exec.Command(egret, "proxy", "--listen", egretAddr, "--metrics", metricsAddr, "--pprof")
	eg.Stdout, eg.Stderr = egretLog, egretLog
	if err := eg.Start(); err != nil {
		return err
	}
	defer stop(eg)

	hpAddr := freeAddr()
	hp, err := startHAProxy(dir, "haproxy", haproxyConfig(hpAddr, upAddr, false, "", ""))
	if err != nil {
		return err
	}
	defer stop(hp)

	cdAddr, cdAdmin := freeAddr(), freeAddr()
	cd, err := startCaddy(dir, "caddy", caddyConfig(cdAddr, cdAdmin, upAddr, false))
	if err != nil {
		return err
	}
	defer stop(cd)

	listening := []string{egretAddr, hpAddr, metricsAddr, cdAddr, cdAdmin}
	targets := []target{
		{name: "direct", addr: upAddr, path: "/"},
		{name: "haproxy", addr: hpAddr, path: "/", pid: hp.Process.Pid},
		{name: "egret", addr: egretAddr, path: "http://" + upAddr + "/", pid: eg.Process.Pid, goStats: metricsAddr},
		{name: "caddy", addr: cdAddr, path: "/", pid: cd.Process.Pid, goStats: cdAdmin},
	}
	if *extra {
		// HAProxy and Caddy writing one log line per request, as egret
		// does; and the floor of a Go proxy: see test/bench/relay.
		hplAddr := freeAddr()
		hpl, err := startHAProxy(dir, "haproxy-log", haproxyConfig(hplAddr, upAddr, true, "", ""))
		if err != nil {
			return err
		}
		defer stop(hpl)
		relayBin, err := goBuild(dir, "relay")
		if err != nil {
			return err
		}
		relayAddr := freeAddr()
		rl := exec.Command(relayBin, relayAddr, upAddr)
		rl.Stderr = os.Stderr
		if err := rl.Start(); err != nil {
			return err
		}
		defer stop(rl)
		cdlAddr, cdlAdmin := freeAddr(), freeAddr()
		cdl, err := startCaddy(dir, "caddy-log", caddyConfig(cdlAddr, cdlAdmin, upAddr, true))
		if err != nil {
			return err
		}
		defer stop(cdl)
		listening = append(listening, hplAddr, relayAddr, cdlAddr, cdlAdmin)
		targets = append(targets,
			target{name: "haproxy+log", addr: hplAddr, path: "/", pid: hpl.Process.Pid},
			target{name: "go-relay", addr: relayAddr, path: "/", pid: rl.Process.Pid},
			target{name: "caddy+log", addr: cdlAddr, path: "/", pid: cdl.Process.Pid, goStats: cdlAdmin})
	}
	for _, a := range listening {
		if err := waitListening(a, 10*time.Second); err != nil {
			return err
		}
	}
	// egret must really be in the way: its answers carry Egret-Request-Id.
	if err := checkEgret(egretAddr, upAddr); err != nil {
		return err
	}
	// Every target carries the upstream's answer.
	for _, tg := range targets {
		if err := oneRequest(tg, len(payload)); err != nil {
			return fmt.Errorf("request through %s: %w", tg.name, err)
		}
	}
	fmt.Printf("upstream %s", upAddr)
	for _, tg := range targets[1:] {
		fmt.Printf(", %s %s (pid %d)", tg.name, tg.addr, tg.pid)
	}
	fmt.Printf("; %d cores", numCPU())
	if *saturate {
		fmt.Printf(", wrk -t%d -c%d -d%v", *threads, *conns, *duration)
	}
	fmt.Print("\n\n")

	// Memory first, on fresh processes, so that heap left by the load runs
	// does not hide the cost of new connections.
	if *idleN > 0 {
		fmt.Printf("memory per idle keep-alive client connection (%d connections, each after one request):\n", *idleN)
		mem := map[string]float64{}
		for _, tg := range targets {
			if tg.pid == 0 {
				continue
			}
			m, err := idleCost(tg, *idleN, len(payload))
			if err != nil {
				return fmt.Errorf("%s idle: %w", tg.name, err)
			}
			mem[tg.name] = m.rss
			fmt.Printf("  %-11s RSS %+8.1f KiB/conn", tg.name, m.rss/1024)
			if m.heap >= 0 {
				fmt.Printf("   Go heap+stacks in use %+6.1f KiB/conn, heap free not returned %+6.1f KiB/conn, goroutines %+.2f/conn",
					m.heap/1024, m.free/1024, m.goroutines)
			}
			fmt.Println()
		}
		fmt.Printf("  RSS per idle connection egret/haproxy %s, egret/caddy %s", ratio(mem["egret"], mem["haproxy"]), ratio(mem["egret"], mem["caddy"]))
		if *extra {
			fmt.Printf(", egret/go-relay %s", ratio(mem["egret"], mem["go-relay"]))
		}
		fmt.Print("\n\n")
	}

	workloads := []workload{
		{"GET", "wrk.method = \"GET\"\n", "GET", 0},
		{"POST 4KiB", "wrk.method = \"POST\"\nwrk.body = string.rep(\"p\", 4096)\nwrk.headers[\"Content-Type\"] = \"application/octet-stream\"\n", "POST", 4096},
	}
	var satErr error
	if *saturate {
		var err error
		if satErr, err = measureSaturation(dir, egret, metricsAddr, upAddr, targets, workloads); err != nil {
			return err
		}
	}
	var paceErr error
	if *paced {
		paceErr = measurePaced(paceBin, upAddr, targets, workloads)
		fmt.Println()
	}
	var h2Err error
	if *h2 {
		h2Err = measureStreams(dir, egret, streamsBin, upAddr, hpAddr, hp.Process.Pid)
	}
	return errors.Join(satErr, paceErr, h2Err)
}

// measureSaturation runs wrk against every target for each workload,
// rounds interleaved, and prints the medians and ratios. notComparable
// reports a run with non-2xx answers or socket errors (after printing);
// err, a run that could not be made.
func measureSaturation(dir, egret, metricsAddr, upAddr string, targets []target, workloads []workload) (notComparable, err error) {
	// Rounds are interleaved across the targets, so that a change in the
	// machine's load hits all three alike; each target's median is kept.
	type key struct{ w, t string }
	results := map[key]result{}
	for wi, w := range workloads {
		scripts := make([]string, len(targets))
		for ti, tg := range targets {
			scripts[ti] = filepath.Join(dir, fmt.Sprintf("w%d-%s.lua", wi, tg.name))
			lua := w.lua + fmt.Sprintf("wrk.path = %q\nwrk.headers[\"Host\"] = %q\n", tg.path, upAddr)
			if err := os.WriteFile(scripts[ti], []byte(lua), 0o644); err != nil {
				return nil, err
			}
			if *warmup > 0 {
				if _, err := runWrk(tg.addr, scripts[ti], *warmup); err != nil {
					return nil, err
				}
			}
		}
		runs := make([][]result, len(targets))
		for round := range *rounds {
			for ti, tg := range targets {
				var prof chan error
				if *profile != "" && wi == 0 && round == 0 && tg.name == "egret" {
					prof = make(chan error, 1)
					go func() { prof <- fetchProfile(metricsAddr, *duration-time.Second, *profile) }()
				}
				u0, s0 := cpuTimes(tg.pid)
				r, err := runWrk(tg.addr, scripts[ti], *duration)
				if err != nil {
					return nil, fmt.Errorf("%s %s: %w", w.name, tg.name, err)
				}
				if tg.pid != 0 && r.requests > 0 {
					u1, s1 := cpuTimes(tg.pid)
					r.cpu = (u1 + s1 - u0 - s0) / time.Duration(r.requests)
					r.sys = (s1 - s0) / time.Duration(r.requests)
				}
				if prof != nil {
					if err := <-prof; err != nil {
						return nil, fmt.Errorf("profile: %w", err)
					}
					fmt.Printf("CPU profile of egret's first GET run: %s (go tool pprof %s %s)\n\n", *profile, egret, *profile)
				}
				runs[ti] = append(runs[ti], r)
			}
		}
		for ti, tg := range targets {
			rs := runs[ti]
			sort.Slice(rs, func(i, j int) bool { return rs[i].rps < rs[j].rps })
			results[key{w.name, tg.name}] = rs[len(rs)/2]
		}
	}

	fmt.Printf("%-10s %-11s %12s %10s %10s %8s %12s %10s\n", "workload", "target", "requests/s", "p50", "p99", "non-2xx", "CPU/request", "of it sys")
	for _, w := range workloads {
		for _, tg := range targets {
			r := results[key{w.name, tg.name}]
			fmt.Printf("%-10s %-11s %12.0f %10s %10s %8d %12s %10s\n", w.name, tg.name, r.rps, fmtDur(r.p50), fmtDur(r.p99), r.non2xx+r.errors, cpuCell(r.cpu), cpuCell(r.sys))
		}
	}
	fmt.Println()
	fmt.Println("ratios (egret / haproxy, egret / direct); added p99 = p99 - direct p99:")
	for _, w := range workloads {
		d, h, e := results[key{w.name, "direct"}], results[key{w.name, "haproxy"}], results[key{w.name, "egret"}]
		added := "n/a: haproxy's p99 is not above direct's"
		if h.p99 > d.p99 {
			added = fmt.Sprintf("%.2f", float64(e.p99-d.p99)/float64(h.p99-d.p99))
		}
		fmt.Printf("  %-10s throughput egret/haproxy %.2f, egret/direct %.2f; p50 egret/haproxy %.2f, p99 egret/haproxy %.2f; added p99 egret %s vs haproxy %s (ratio %s); CPU per request egret/haproxy %.2f\n",
			w.name, e.rps/h.rps, e.rps/d.rps, float64(e.p50)/float64(h.p50), float64(e.p99)/float64(h.p99),
			fmtDur(e.p99-d.p99), fmtDur(h.p99-d.p99), added, float64(e.cpu)/float64(max(h.cpu, 1)))
		c := results[key{w.name, "caddy"}]
		fmt.Printf("  %-10s Go peer: throughput egret/caddy %.2f, caddy/haproxy %.2f; CPU per request egret/caddy %s, caddy/haproxy %s\n",
			w.name, e.rps/c.rps, c.rps/h.rps, ratio(float64(e.cpu), float64(c.cpu)), ratio(float64(c.cpu), float64(h.cpu)))
		if *extra {
			hl, g, cl := results[key{w.name, "haproxy+log"}], results[key{w.name, "go-relay"}], results[key{w.name, "caddy+log"}]
			fmt.Printf("  %-10s baselines: throughput egret/haproxy+log %.2f, egret/caddy+log %.2f, go-relay/haproxy %.2f; CPU per request egret/haproxy+log %.2f, egret/caddy+log %s, go-relay/haproxy %.2f, egret/go-relay %.2f, caddy/go-relay %s\n",
				w.name, e.rps/hl.rps, e.rps/cl.rps, g.rps/h.rps, float64(e.cpu)/float64(max(hl.cpu, 1)), ratio(float64(e.cpu), float64(cl.cpu)),
				float64(g.cpu)/float64(max(h.cpu, 1)), float64(e.cpu)/float64(max(g.cpu, 1)), ratio(float64(c.cpu), float64(g.cpu)))
			fmt.Printf("  %-10s split: system CPU per request egret/go-relay %s, user egret/go-relay %s\n",
				w.name, ratio(float64(e.sys), float64(g.sys)), ratio(float64(e.cpu-e.sys), float64(g.cpu-g.sys)))
		}
	}
	var satErr error
	for _, w := range workloads {
		for _, tg := range targets {
			if r := results[key{w.name, tg.name}]; r.non2xx+r.errors > 0 && satErr == nil {
				satErr = fmt.Errorf("%s %s: %d non-2xx answers or socket errors: the figures are not comparable", w.name, tg.name, r.non2xx+r.errors)
			}
		}
	}
	return satErr, nil
}

// ratio is a/b with two decimals, "n/a" when b is not above 0 (a figure
// not measured, or a memory growth lost in the noise).
func ratio(a, b float64) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// cpuCell is a CPU time per request for the tables ("-" when not measured).
func cpuCell(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmtDur(d)
}

// goBuild builds test/bench/NAME of this module into dir.
func goBuild(dir, name string) (string, error) {
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, "github.com/egret-proxy/egret/test/bench/"+name)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w", name, err)
	}
	return bin, nil
}

// paceResult is one run of test/bench/pace (its JSON line), and the
// target's CPU time per request over it.
type paceResult struct {
	pacereport.Report
	cpu time.Duration
}

// measurePaced runs pace at -rate against every target for each workload,
// rounds interleaved across the targets as the wrk runs are, keeps each
// target's median by p99 and prints them with the latency the proxies add
// to the direct run's. A run with socket errors, non-2xx answers or an
// achieved rate more than 2 % below -rate makes it fail, after printing.
func measurePaced(bin, host string, targets []target, workloads []workload) error {
	type key struct{ w, t string }
	results := map[key]paceResult{}
	spread := map[key][2]time.Duration{} // the lowest and highest p99 of the rounds
	var bad []string
	var late50, late99 time.Duration
	for _, w := range workloads {
		runs := make([][]paceResult, len(targets))
		for range *rounds {
			for ti, tg := range targets {
				cpu0 := cpuTime(tg.pid)
				r, err := runPace(bin, tg, host, w)
				if err != nil {
					return fmt.Errorf("paced %s %s: %w", w.name, tg.name, err)
				}
				// Over the warmup's requests too: the rate is the same.
				if tg.pid != 0 && r.Total > 0 {
					r.cpu = (cpuTime(tg.pid) - cpu0) / time.Duration(r.Total)
				}
				if n := r.Errors + r.Non2xx; n > 0 {
					bad = append(bad, fmt.Sprintf("%s %s: %d non-2xx answers or socket errors", w.name, tg.name, n))
				}
				if r.Rate < 0.98**rate {
					bad = append(bad, fmt.Sprintf("%s %s: %.0f requests/s achieved, more than 2 %% below %g", w.name, tg.name, r.Rate, *rate))
				}
				late50, late99 = max(late50, r.LateP50), max(late99, r.LateP99)
				runs[ti] = append(runs[ti], r)
			}
		}
		for ti, tg := range targets {
			rs := runs[ti]
			sort.Slice(rs, func(i, j int) bool { return rs[i].P99 < rs[j].P99 })
			results[key{w.name, tg.name}] = rs[len(rs)/2]
			spread[key{w.name, tg.name}] = [2]time.Duration{rs[0].P99, rs[len(rs)-1].P99}
		}
	}

	fmt.Printf("\npaced: %g requests/s on %d keep-alive connections (open loop), latency from each request's intended send time; median of %d by p99\n",
		*rate, *paceN, *rounds)
	fmt.Printf("%-10s %-11s %12s %10s %10s %19s %10s %8s %12s\n", "workload", "target", "requests/s", "p50", "p99", "p99 of the rounds", "p99.9", "non-2xx", "CPU/request")
	for _, w := range workloads {
		for _, tg := range targets {
			r, sp := results[key{w.name, tg.name}], spread[key{w.name, tg.name}]
			fmt.Printf("%-10s %-11s %12.0f %10s %10s %19s %10s %8d %12s\n", w.name, tg.name, r.Rate, fmtDur(r.P50), fmtDur(r.P99), fmtDur(sp[0])+"–"+fmtDur(sp[1]), fmtDur(r.P999), r.Non2xx+r.Errors, cpuCell(r.cpu))
		}
	}
	fmt.Printf("(the generator's own lateness, in every figure alike: wake-ups p50 %s, p99 %s at worst)\n", fmtDur(late50), fmtDur(late99))
	fmt.Println()
	fmt.Printf("added latency at %g requests/s:\n", *rate)
	added := func(name string, d, h, e time.Duration) string {
		ratio := "n/a: haproxy's is not above 0"
		if h-d > 0 {
			ratio = fmt.Sprintf("%.2f", float64(e-d)/float64(h-d))
		}
		return fmt.Sprintf("added %s (%s - direct %s): egret %s vs haproxy %s, ratio %s", name, name, name, fmtDur(e-d), fmtDur(h-d), ratio)
	}
	for _, w := range workloads {
		d, h, e := results[key{w.name, "direct"}], results[key{w.name, "haproxy"}], results[key{w.name, "egret"}]
		c := results[key{w.name, "caddy"}]
		fmt.Printf("  %-10s %s\n", w.name, added("p99", d.P99, h.P99, e.P99))
		fmt.Printf("  %-10s %s\n", w.name, added("p50", d.P50, h.P50, e.P50))
		fmt.Printf("  %-10s Go peer: added p99 caddy %s, p50 caddy %s; CPU per request egret/caddy %s, egret/haproxy %s\n",
			w.name, fmtDur(c.P99-d.P99), fmtDur(c.P50-d.P50), ratio(float64(e.cpu), float64(c.cpu)), ratio(float64(e.cpu), float64(h.cpu)))
		if *extra {
			hl, g, cl := results[key{w.name, "haproxy+log"}], results[key{w.name, "go-relay"}], results[key{w.name, "caddy+log"}]
			fmt.Printf("  %-10s baselines: added p99 haproxy+log %s, go-relay %s, caddy+log %s; added p50 haproxy+log %s, go-relay %s, caddy+log %s; CPU per request egret/go-relay %s\n",
				w.name, fmtDur(hl.P99-d.P99), fmtDur(g.P99-d.P99), fmtDur(cl.P99-d.P99), fmtDur(hl.P50-d.P50), fmtDur(g.P50-d.P50), fmtDur(cl.P50-d.P50),
				ratio(float64(e.cpu), float64(g.cpu)))
		}
	}
	if len(bad) > 0 {
		fmt.Println("\nthe paced figures are not comparable:")
		for _, b := range bad {
			fmt.Println("  " + b)
		}
		return fmt.Errorf("paced runs: %s", strings.Join(bad, "; "))
	}
	return nil
}

// runPace runs pace against tg with workload w: -warmup unrecorded, then
// -duration measured.
func runPace(bin string, tg target, host string, w workload) (paceResult, error) {
	var r paceResult
	args := []string{"-addr", tg.addr, "-path", tg.path, "-host", host, "-method", w.method, "-body", strconv.Itoa(w.body),
		"-rate", strconv.FormatFloat(*rate, 'f', -1, 64), "-conns", strconv.Itoa(*paceN),
		"-warmup", warmup.String(), "-duration", duration.String()}
	ctx, cancel := context.WithTimeout(context.Background(), *warmup+*duration+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = os.Stderr // its first socket error, if any
	out, err := cmd.Output()
	if err != nil {
		return r, fmt.Errorf("pace: %w", err)
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("pace output %q: %w", out, err)
	}
	return r, nil
}

// startHAProxy checks and starts HAProxy with config cfg; its output goes
// to name.log in dir.
func startHAProxy(dir, name, cfg string) (*exec.Cmd, error) {
	path := filepath.Join(dir, name+".cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.Command(*haproxy, "-c", "-f", path).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("haproxy -c: %v\n%s", err, out)
	}
	hp := exec.Command(*haproxy, "-db", "-f", path)
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	hp.Stdout, hp.Stderr = logf, logf
	if err := hp.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	return hp, nil
}

// haproxyConfig is HAProxy's counterpart of egret's embedded defaults; with
// logged, it writes one line per request to its standard output (a file),
// as egret does. bindProto and serverProto are the protocols of its bind
// and server lines ("h2" for HTTP/2 with prior knowledge, "" for HTTP/1.1).
func haproxyConfig(listen, upstream string, logged bool, bindProto, serverProto string) string {
	logGlobal, logDefaults := "", ""
	if logged {
		logGlobal = "    log stdout format raw local0 info\n"
		logDefaults = "    log global\n    option httplog\n"
	}
	// maxconn: 8000, or room for -idle's connections and a few more.
	return fmt.Sprintf(`global
%s    maxconn %d
defaults
%s    mode http
    timeout connect 10s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 90s
    option http-keep-alive
    retries 2
    retry-on conn-failure empty-response response-timeout 503
frontend fe
    bind %s%s
    default_backend be
backend be
    server up %s%s
`, logGlobal, max(8000, *idleN+256), logDefaults, listen, protoOpt(bindProto), upstream, protoOpt(serverProto))
}

// protoOpt is HAProxy's "proto NAME" option of a bind or server line ("":
// none, HTTP/1.1).
func protoOpt(name string) string {
	if name == "" {
		return ""
	}
	return " proto " + name
}

// startCaddy checks and starts Caddy with the JSON config cfg; its output
// goes to name.log in dir, and its config and data directories are under
// dir (nothing is written to the user's home).
func startCaddy(dir, name, cfg string) (*exec.Cmd, error) {
	path := filepath.Join(dir, name+".json")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	home := filepath.Join(dir, name+"-home")
	env := append(os.Environ(), "XDG_CONFIG_HOME="+filepath.Join(home, "config"), "XDG_DATA_HOME="+filepath.Join(home, "data"))
	check := exec.Command(*caddyBin, "validate", "--config", path)
	check.Env = env
	if out, err := check.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("caddy validate: %v\n%s", err, out)
	}
	cd := exec.Command(*caddyBin, "run", "--config", path)
	cd.Env = env
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cd.Stdout, cd.Stderr = logf, logf
	if err := cd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	return cd, nil
}

// caddyConfig is Caddy's counterpart of egret's embedded defaults: one
// reverse_proxy to the upstream with 2 retries (Caddy retries a failed
// dial for any request, other failures of GETs only), keep-alive
// connections to it, no automatic HTTPS. Its admin endpoint listens on
// loopback at admin, for the Go runtime's figures (/metrics) and a garbage
// collection (/debug/pprof). With logged, it writes one access log line
// per request (JSON, to its standard error: a file), as egret does.
func caddyConfig(listen, admin, upstream string, logged bool) string {
	type m = map[string]any
	server := m{
		"listen":          []string{listen},
		"automatic_https": m{"disable": true},
		"routes": []m{{"handle": []m{{
			"handler":        "reverse_proxy",
			"upstreams":      []m{{"dial": upstream}},
			"load_balancing": m{"retries": 2},
			"transport": m{
				"protocol":   "http",
				"keep_alive": m{"enabled": true, "idle_timeout": "90s", "max_idle_conns_per_host": 256},
			},
		}}}},
	}
	if logged {
		server["logs"] = m{}
	}
	cfg := m{
		"admin": m{"listen": admin, "config": m{"persist": false}},
		"apps":  m{"http": m{"servers": m{"bench": server}}},
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		panic(err) // maps of strings, numbers and bools
	}
	return string(b)
}

var (
	reRPS     = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	reCount   = regexp.MustCompile(`(\d+) requests in`)
	reLat     = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s|m)\s*$`)
	reNon2xx  = regexp.MustCompile(`Non-2xx or 3xx responses:\s+(\d+)`)
	reSockErr = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

func runWrk(addr, script string, d time.Duration) (result, error) {
	args := []string{"-t", strconv.Itoa(*threads), "-c", strconv.Itoa(*conns), "-d", fmt.Sprintf("%ds", int(d.Seconds()+0.5)),
		"--latency", "-s", script, "http://" + addr + "/"}
	out, err := exec.Command(*wrkBin, args...).CombinedOutput()
	if err != nil {
		return result{}, fmt.Errorf("wrk: %v\n%s", err, out)
	}
	s := string(out)
	var r result
	m := reRPS.FindStringSubmatch(s)
	if m == nil {
		return r, fmt.Errorf("wrk output without Requests/sec:\n%s", s)
	}
	r.rps, _ = strconv.ParseFloat(m[1], 64)
	if m := reCount.FindStringSubmatch(s); m != nil {
		r.requests, _ = strconv.ParseInt(m[1], 10, 64)
	}
	for _, m := range reLat.FindAllStringSubmatch(s, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second, "m": time.Minute}[m[3]]
		dur := time.Duration(v * float64(unit))
		if m[1] == "50" {
			r.p50 = dur
		} else {
			r.p99 = dur
		}
	}
	if r.p50 == 0 || r.p99 == 0 {
		return r, fmt.Errorf("wrk output without latency percentiles:\n%s", s)
	}
	if m := reNon2xx.FindStringSubmatch(s); m != nil {
		r.non2xx, _ = strconv.Atoi(m[1])
	}
	if m := reSockErr.FindStringSubmatch(s); m != nil {
		for _, x := range m[1:] {
			n, _ := strconv.Atoi(x)
			r.errors += n
		}
	}
	return r, nil
}

// memCost is the cost of one idle connection.
type memCost struct {
	rss        float64 // bytes of resident memory
	heap       float64 // bytes of Go heap + stacks in use (-1: unknown)
	free       float64 // bytes of Go heap free but not returned to the OS
	goroutines float64
}

// idleCost opens n keep-alive connections to tg, sends one request on each
// and reads its answer (of want bytes), then measures the process's growth
// with the connections idle; for a target with Go runtime figures
// (goStats) after a garbage collection each time.
//
// Each reading is taken after -idle-settle, a collection, -idle-settle
// again and a collection: the first wait lets the target settle (egret
// parks its idle connections after 1 s), the first collection frees the
// stacks of goroutines that have exited (Go keeps them with the dead
// goroutines until a collection), and the second wait gives Go's
// scavenger time to return freed memory to the OS, as it does within
// seconds in a long-running process. For targets without Go figures the
// collections are no-ops.
func idleCost(tg target, n, want int) (memCost, error) {
	c := memCost{heap: -1}
	metrics := tg.goStats
	settle := func() {
		time.Sleep(*settleD)
		collect(metrics)
		time.Sleep(*settleD)
		collect(metrics)
	}
	// One request first, so that the process has served traffic.
	if err := oneRequest(tg, want); err != nil {
		return c, err
	}
	settle()
	rss0, err := rss(tg.pid)
	if err != nil {
		return c, err
	}
	heap0, free0, gr0, merr := goMem(metrics)
	open := make([]net.Conn, 0, n)
	defer func() {
		for _, cn := range open {
			cn.Close()
		}
	}()
	req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: bench\r\n\r\n", tg.path)
	for range n {
		cn, err := net.DialTimeout("tcp", tg.addr, 5*time.Second)
		if err != nil {
			return c, err
		}
		open = append(open, cn)
		cn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(cn, req); err != nil {
			return c, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(cn), nil)
		if err != nil {
			return c, err
		}
		got, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return c, err
		}
		if resp.StatusCode != 200 || got != int64(want) {
			return c, fmt.Errorf("answer %d with %d bytes, want 200 with %d", resp.StatusCode, got, want)
		}
		cn.SetDeadline(time.Time{})
	}
	settle()
	rss1, err := rss(tg.pid)
	if err != nil {
		return c, err
	}
	c.rss = float64(rss1-rss0) / float64(n)
	if merr == nil {
		if heap1, free1, gr1, err := goMem(metrics); err == nil {
			c.heap = (heap1 - heap0) / float64(n)
			c.free = (free1 - free0) / float64(n)
			c.goroutines = (gr1 - gr0) / float64(n)
		}
	}
	return c, nil
}

// collect has a Go target's garbage collector run (its pprof heap profile
// with gc=1), so that memory in use is what is live, not garbage a
// collection has not come for yet. A no-op without an address.
func collect(metrics string) {
	if metrics == "" {
		return
	}
	if resp, err := http.Get("http://" + metrics + "/debug/pprof/heap?gc=1"); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// oneRequest sends one GET through tg and checks that the upstream's
// answer, 200 with want bytes, comes back.
func oneRequest(tg target, want int) error {
	cn, err := net.DialTimeout("tcp", tg.addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer cn.Close()
	cn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(cn, "GET %s HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n", tg.path)
	resp, err := http.ReadResponse(bufio.NewReader(cn), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	got, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 || got != int64(want) {
		return fmt.Errorf("answer %d with %d bytes, want 200 with %d", resp.StatusCode, got, want)
	}
	return nil
}

// goMem reads the Go runtime's heap and stacks in use, its heap free but
// not returned to the OS (runtime/metrics' /memory/classes/heap/free:bytes,
// which a goroutine's freed stack joins until the scavenger returns it),
// and goroutines, from a Go target's /metrics (egret's, Caddy's admin
// endpoint).
func goMem(addr string) (inUse, free, goroutines float64, err error) {
	if addr == "" {
		return 0, 0, 0, errors.New("no metrics")
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	vals := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			switch f[0] {
			case "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines",
				"go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes":
				v, _ := strconv.ParseFloat(f[1], 64)
				vals[f[0]] = v
			}
		}
	}
	if len(vals) != 5 {
		return 0, 0, 0, fmt.Errorf("metrics without Go memory figures")
	}
	return vals["go_memstats_heap_inuse_bytes"] + vals["go_memstats_stack_inuse_bytes"],
		vals["go_memstats_heap_idle_bytes"] - vals["go_memstats_heap_released_bytes"], vals["go_goroutines"], nil
}

// rss is the resident set of pid in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

func checkEgret(egretAddr, upAddr string) error {
	cn, err := net.DialTimeout("tcp", egretAddr, 5*time.Second)
	if err != nil {
		return err
	}
	defer cn.Close()
	cn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(cn, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", upAddr, upAddr)
	resp, err := http.ReadResponse(bufio.NewReader(cn), nil)
	if err != nil {
		return fmt.Errorf("request through egret: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Egret-Request-Id") == "" || resp.Header.Get("Egret-Attempts") != "1" {
		return fmt.Errorf("egret answered %d without its headers: %v", resp.StatusCode, resp.Header)
	}
	return nil
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitListening(addr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s after %v", addr, d)
}

func stop(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	select {
	case <-done:
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
	}
}

// raiseFileLimit lifts the soft descriptor limit to the hard one, for the
// idle connections (children inherit it); as root with CAP_SYS_RESOURCE,
// first the hard one to what -idle needs. It fails when -idle connections
// cannot fit: egret counts two descriptors per client connection and keeps
// an eighth of its limit in reserve (proxy.FDs), so it holds at most 7/16
// of the limit (8,750 under a hard limit of 20,000). Only this process and
// its children are affected, nothing host-wide.
func raiseFileLimit(idle int) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	if want := uint64(4*idle + 4096); l.Max < want {
		up := syscall.Rlimit{Cur: want, Max: want}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &up) == nil {
			return nil
		}
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return err
		}
	}
	if most := int(l.Cur * 7 / 16); idle > most {
		return fmt.Errorf("-idle %d: egret can hold at most %d connections under a descriptor limit of %d (raising the hard limit needs CAP_SYS_RESOURCE)", idle, most, l.Cur)
	}
	return nil
}

func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "processor\t:")
}

func fmtDur(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + fmtDur(-d)
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
}

// cpuTime is the user + system CPU time process pid has used so far (0 for
// pid 0), from /proc/PID/stat (in clock ticks of 10 ms).
func cpuTime(pid int) time.Duration {
	u, s := cpuTimes(pid)
	return u + s
}

// cpuTimes is cpuTime's user and system parts. The system part is the
// kernel's work for the process: its system calls, and on loopback the
// delivery of what it writes to the reader's socket.
func cpuTimes(pid int) (user, sys time.Duration) {
	if pid == 0 {
		return 0, 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// The command name (field 2) may hold spaces: count from its ")".
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut) * 10 * time.Millisecond, time.Duration(st) * 10 * time.Millisecond
}

// fetchProfile writes a CPU profile of egret taken over d (--pprof) to file.
func fetchProfile(metricsAddr string, d time.Duration, file string) error {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", metricsAddr, max(1, int(d.Seconds()))))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET profile: %s", resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
