package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/egret-proxy/egret/test/bench/internal/streamsreport"
)

// The h2c section: GETs with many requests in flight on few HTTP/2
// connections (h2c, prior knowledge, as gRPC clients speak between pods)
// beside the same number in flight on HTTP/1.1 keep-alive connections, one
// each, driven by test/bench/streams against the same upstream (the
// bench's, which serves both). egret serves h2c only in transparent mode,
// to a connection a pod opened to its destination: so egret's rows run the
// generator as `egret run -- streams ...` (the generator's connects to the
// upstream redirected to egret by eBPF, the bench being root), a fresh
// egret run for each run, whose process is the proxy measured. HAProxy
// serves h2c with `proto h2` on its bind line, and speaks h2 to the
// upstream (`proto h2` on its server line) as egret does (a pod's HTTP/2
// goes on as HTTP/2), or HTTP/1.1 (haproxy h2>h1: the cost of HAProxy's
// h2 termination alone, beside).

// streamTarget is one row of the h2c section.
type streamTarget struct {
	name  string // the row's name
	proto string // streams' -proto: h2c or http1
	addr  string // where the generator connects
	pid   int    // the process measured (0: none; egret run's own, found by the generator)
	// egretRun: the generator runs under `egret run` and every answer
	// must carry Egret-Attempts.
	egretRun bool
}

// measureStreams starts HAProxy with `proto h2` on its bind line (h2 or
// HTTP/1.1 to the upstream), runs test/bench/streams against the direct
// upstream, HAProxy and egret (transparent) in both protocols, rounds
// interleaved, and prints the medians and ratios. A target that fails
// (egret without its HTTP/2 server answers without Egret-Attempts) is
// printed as FAILED and makes it return an error, after the others are
// measured.
func measureStreams(dir, egret, bin, upAddr, hpAddr string, hpPID int) error {
	hp2Addr, hp21Addr := freeAddr(), freeAddr()
	hp2, err := startHAProxy(dir, "haproxy-h2", haproxyConfig(hp2Addr, upAddr, false, "h2", "h2"))
	if err != nil {
		return err
	}
	defer stop(hp2)
	hp21, err := startHAProxy(dir, "haproxy-h2h1", haproxyConfig(hp21Addr, upAddr, false, "h2", ""))
	if err != nil {
		return err
	}
	defer stop(hp21)
	for _, a := range []string{hp2Addr, hp21Addr} {
		if err := waitListening(a, 10*time.Second); err != nil {
			return err
		}
	}
	targets := []streamTarget{
		{name: "direct", proto: "http1", addr: upAddr},
		{name: "direct", proto: "h2c", addr: upAddr},
		{name: "haproxy", proto: "http1", addr: hpAddr, pid: hpPID},
		{name: "haproxy", proto: "h2c", addr: hp2Addr, pid: hp2.Process.Pid},
		{name: "haproxy h2>h1", proto: "h2c", addr: hp21Addr, pid: hp21.Process.Pid},
		{name: "egret run", proto: "http1", addr: upAddr, egretRun: true},
		{name: "egret run", proto: "h2c", addr: upAddr, egretRun: true},
	}
	fmt.Printf("h2c and HTTP/1.1 GETs (test/bench/streams): %d requests in flight at most, on %d h2c connections × %d streams or %d HTTP/1.1 connections; %v measured after %v, %d rounds interleaved, each figure the median of the rounds\n",
		*h2Conns**h2Stream, *h2Conns, *h2Stream, *h2Conns**h2Stream, *duration, *warmup, *rounds)
	fmt.Println("closed loop (saturation):")
	err = streamsRounds(dir, egret, bin, targets, 0)
	if *h2Rate > 0 {
		fmt.Printf("\npaced: %g requests/s (open loop), latency from each request's intended send time:\n", *h2Rate)
		err = errors.Join(err, streamsRounds(dir, egret, bin, targets, *h2Rate))
	}
	return err
}

// streamsRounds runs the generator against every target, closed loop
// (rate 0) or at rate, -rounds rounds interleaved so that a change in the
// machine's load hits all alike, and prints each target's medians and the
// ratios. A paced run more than 2 % short of rate is not comparable.
func streamsRounds(dir, egret, bin string, targets []streamTarget, rate float64) error {
	runs := make([][]streamsreport.Report, len(targets))
	failed := make([]error, len(targets))
	for round := range *rounds {
		for ti, tg := range targets {
			if failed[ti] != nil {
				continue // it failed once: its reason is printed below
			}
			r, err := runStreams(dir, egret, bin, tg, round, rate)
			if err != nil {
				failed[ti] = err
				continue
			}
			runs[ti] = append(runs[ti], r)
		}
	}

	// Each figure is the median of the rounds, figure by figure.
	type row struct {
		rate                          float64
		p50, p99, p999, cpu, sys      time.Duration
		requests, errors, bad, rounds int64
		firstError                    string
		lowRate                       float64 // the lowest rate of the rounds
		late99                        time.Duration
	}
	rows := make([]row, len(targets))
	for ti, rs := range runs {
		if len(rs) == 0 {
			continue
		}
		med := func(f func(streamsreport.Report) float64) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = f(r)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		dur := func(f func(streamsreport.Report) time.Duration) time.Duration {
			return time.Duration(med(func(r streamsreport.Report) float64 { return float64(f(r)) }))
		}
		w := &rows[ti]
		w.rounds = int64(len(rs))
		w.rate = med(func(r streamsreport.Report) float64 { return r.Rate })
		w.p50 = dur(func(r streamsreport.Report) time.Duration { return r.P50 })
		w.p99 = dur(func(r streamsreport.Report) time.Duration { return r.P99 })
		w.p999 = dur(func(r streamsreport.Report) time.Duration { return r.P999 })
		if targets[ti].pid != 0 || targets[ti].egretRun {
			w.cpu = dur(func(r streamsreport.Report) time.Duration { return r.CPU / time.Duration(max(r.Requests, 1)) })
		}
		w.lowRate = rs[0].Rate
		for _, r := range rs {
			w.lowRate = min(w.lowRate, r.Rate)
			w.late99 = max(w.late99, r.LateP99)
			w.requests += r.Requests
			w.errors += r.Errors
			w.bad += r.Bad
			if w.firstError == "" {
				w.firstError = r.FirstError
			}
		}
	}

	fmt.Printf("%-14s %-6s %12s %10s %10s %10s %12s %9s\n", "target", "proto", "requests/s", "p50", "p99", "p99.9", "CPU/request", "errors")
	for ti, tg := range targets {
		if failed[ti] != nil {
			fmt.Printf("%-14s %-6s FAILED: %v\n", tg.name, tg.proto, failed[ti])
			continue
		}
		w := rows[ti]
		fmt.Printf("%-14s %-6s %12.0f %10s %10s %10s %12s %9d\n", tg.name, tg.proto, w.rate, fmtDur(w.p50), fmtDur(w.p99), fmtDur(w.p999), cpuCell(w.cpu), w.errors+w.bad)
	}
	if rate > 0 {
		var late time.Duration
		for _, w := range rows {
			late = max(late, w.late99)
		}
		fmt.Printf("(the generator's own lateness, in every figure alike: wake-ups p99 %s at worst)\n", fmtDur(late))
	}
	fmt.Println()
	get := func(name, proto string) (row, bool) {
		for ti, tg := range targets {
			if tg.name == name && tg.proto == proto {
				return rows[ti], failed[ti] == nil
			}
		}
		panic("no target " + name + " " + proto)
	}
	cmp := func(what string, a, b row, aok, bok bool) {
		if !aok || !bok {
			fmt.Printf("  %-32s n/a: a target failed\n", what)
			return
		}
		fmt.Printf("  %-32s CPU per request %s, p99 %s, throughput %s\n", what,
			ratio(float64(a.cpu), float64(b.cpu)), ratio(float64(a.p99), float64(b.p99)), ratio(a.rate, b.rate))
	}
	dh1, _ := get("direct", "http1")
	dh2, _ := get("direct", "h2c")
	hh1, hh1ok := get("haproxy", "http1")
	hh2, hh2ok := get("haproxy", "h2c")
	h21, h21ok := get("haproxy h2>h1", "h2c")
	eh1, eh1ok := get("egret run", "http1")
	eh2, eh2ok := get("egret run", "h2c")
	fmt.Println("ratios:")
	cmp("egret h2c / egret http1", eh2, eh1, eh2ok, eh1ok)
	cmp("haproxy h2c / haproxy http1", hh2, hh1, hh2ok, hh1ok)
	cmp("egret h2c / haproxy h2c", eh2, hh2, eh2ok, hh2ok)
	cmp("egret http1 / haproxy http1", eh1, hh1, eh1ok, hh1ok)
	cmp("haproxy h2>h1 / haproxy h2c", h21, hh2, h21ok, hh2ok)
	if rate > 0 {
		fmt.Println("added latency (minus direct's in the same protocol):")
	} else {
		fmt.Println("added latency (minus direct's in the same protocol; at saturation mostly queueing, see the paced runs):")
	}
	for _, a := range []struct {
		name string
		r, d row
		ok   bool
	}{{"haproxy http1", hh1, dh1, hh1ok}, {"egret http1", eh1, dh1, eh1ok}, {"haproxy h2c", hh2, dh2, hh2ok}, {"haproxy h2>h1", h21, dh2, h21ok}, {"egret h2c", eh2, dh2, eh2ok}} {
		if a.ok {
			fmt.Printf("  %-14s p50 %s, p99 %s\n", a.name, fmtDur(a.r.p50-a.d.p50), fmtDur(a.r.p99-a.d.p99))
		}
	}

	section := "h2c section, closed loop"
	if rate > 0 {
		section = fmt.Sprintf("h2c section, paced at %g/s", rate)
	}
	var errs []error
	for ti, tg := range targets {
		if failed[ti] != nil {
			errs = append(errs, fmt.Errorf("%s, %s %s: %w", section, tg.name, tg.proto, failed[ti]))
		} else if n := rows[ti].errors + rows[ti].bad; n > 0 {
			errs = append(errs, fmt.Errorf("%s, %s %s: %d errors or bad answers (first: %s): the figures are not comparable", section, tg.name, tg.proto, n, rows[ti].firstError))
		} else if rate > 0 && rows[ti].lowRate < 0.98*rate {
			errs = append(errs, fmt.Errorf("%s, %s %s: %.0f requests/s achieved, more than 2 %% below %g: the paced figures are not comparable", section, tg.name, tg.proto, rows[ti].lowRate, rate))
		}
	}
	return errors.Join(errs...)
}

// runStreams runs the generator against tg once: -warmup unrecorded, then
// -duration measured. For egret it runs as `egret run -- streams ...`,
// egret run's output going to a log in dir.
func runStreams(dir, egret, bin string, tg streamTarget, round int, rate float64) (streamsreport.Report, error) {
	var r streamsreport.Report
	args := []string{"-addr", tg.addr, "-proto", tg.proto, "-conns", strconv.Itoa(*h2Conns), "-streams", strconv.Itoa(*h2Stream),
		"-warmup", warmup.String(), "-duration", duration.String(), "-want-bytes", "64",
		"-rate", strconv.FormatFloat(rate, 'f', -1, 64)}
	ctx, cancel := context.WithTimeout(context.Background(), *warmup+*duration+time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	var logPath string
	if tg.egretRun {
		// Every answer must carry Egret-Attempts: egret served it.
		args = append(args, "-want-header", "Egret-Attempts", "-cpu-parent")
		cmd = exec.CommandContext(ctx, egret, append([]string{"run", "--", bin}, args...)...)
		logPath = filepath.Join(dir, fmt.Sprintf("egret-run-%s-%g-%d.log", tg.proto, rate, round))
		logf, err := os.Create(logPath)
		if err != nil {
			return r, err
		}
		defer logf.Close()
		cmd.Stderr = logf
	} else {
		if tg.pid != 0 {
			args = append(args, "-cpu-pid", strconv.Itoa(tg.pid))
		}
		cmd = exec.CommandContext(ctx, bin, args...)
		cmd.Stderr = os.Stderr
	}
	out, runErr := cmd.Output()
	// The generator's JSON line is the last line of the output that is
	// one (egret run passes the command's standard output on).
	var line []byte
	for l := range bytes.Lines(out) {
		if l = bytes.TrimSpace(l); len(l) > 0 && l[0] == '{' {
			line = l
		}
	}
	jsonErr := json.Unmarshal(line, &r)
	switch {
	case jsonErr == nil && r.Error != "":
		err := errors.New(r.Error)
		if tg.egretRun && strings.Contains(r.Error, "without Egret-Attempts") {
			err = fmt.Errorf("%w: egret did not answer this %s connection itself (an egret without the pod-side HTTP/2 server passes h2c through to the upstream)", err, tg.proto)
		}
		return r, err
	case runErr != nil:
		return r, fmt.Errorf("%v%s", runErr, logTail(logPath))
	case jsonErr != nil:
		return r, fmt.Errorf("streams output %q: %w", out, jsonErr)
	}
	return r, nil
}

// logTail is the last lines of the log at path, to follow an error ("" for
// none).
func logTail(path string) string {
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return "; egret run's last log lines (" + path + "):\n" + strings.Join(lines[max(0, len(lines)-5):], "\n")
}
