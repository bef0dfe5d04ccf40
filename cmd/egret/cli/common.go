package cli

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"syscall"
	"time"

	"github.com/egret-proxy/egret/internal/heapfloor"
	"github.com/egret-proxy/egret/internal/textlog"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"
)

// Flags of the logs, the same on every command that serves.
var (
	logFormatFlag = &cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format: text or json (json gives durations in seconds, as a float, as Prometheus and OpenTelemetry do)"}
	logLevelFlag  = &cli.StringFlag{Name: "log-level", Value: "info", Usage: "least level logged: debug, info, warn or error (request lines are info)"}
)

// accessLogFlag is --access-log with the command's default, and why.
func accessLogFlag(def, why string) *cli.StringFlag {
	return &cli.StringFlag{Name: "access-log", Value: def, Usage: "which requests get a log line: all, errors (retried, denied a retry, ambiguous, not-sent, failed, rejected, 5xx) or off; " + why}
}

// accessLog reads --access-log.
func accessLog(c *cli.Context) (proxy.AccessLog, error) {
	a, err := proxy.ParseAccessLog(c.String("access-log"))
	if err != nil {
		return 0, usage("--access-log %s: expected all, errors or off", c.String("access-log"))
	}
	return a, nil
}

// logLevel reads --log-level.
func logLevel(c *cli.Context) (slog.Level, error) {
	switch c.String("log-level") {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, usage("--log-level %s: expected debug, info, warn or error", c.String("log-level"))
}

// newLogger builds the logger --log-format and --log-level ask for,
// writing to w.
func newLogger(c *cli.Context, w io.Writer) (*slog.Logger, error) {
	level, err := logLevel(c)
	if err != nil {
		return nil, err
	}
	switch c.String("log-format") {
	case "text":
		// slog's text format, written faster for the per-request lines.
		h, _ := textlog.New(w, &slog.HandlerOptions{Level: level})
		return slog.New(h), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: secondsAttr})), nil
	}
	return nil, usage("--log-format %s: expected text or json", c.String("log-format"))
}

// CheckLogFlags reports whether c's --log-format and --log-level are ones
// the commands that log (egret agent, proxy, keeper) take: the same check
// they make before they start. deploy's tests hold the chart's logLevel
// and logFormat values to it.
func CheckLogFlags(c *cli.Context) error {
	_, err := newLogger(c, io.Discard)
	return err
}

// secondsAttr writes a duration as seconds, a float ("duration":0.0087),
// rather than slog's bare nanoseconds.
func secondsAttr(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.Float64(a.Key, a.Value.Duration().Seconds())
	}
	return a
}

// Flags bounding the per-workload series (proxy.WorkloadOptions).
var (
	metricsUpstreamsFlag = &cli.IntFlag{Name: "metrics-upstreams", Value: proxy.DefaultUpstreamCap, Usage: "upstreams the policy does not name that get a label of their own in the per-workload series; beyond, until one is idle past --metrics-series-ttl, they are counted as upstream=\"other\" (the policy's named upstreams always get theirs)"}
	metricsTTLFlag       = &cli.DurationFlag{Name: "metrics-series-ttl", Value: proxy.DefaultSeriesTTL, Usage: "a per-workload series with no request for this long disappears (a deleted pod's go at once)"}
)

// newProxyMetrics makes the proxy's metrics, registered with reg, with the
// per-workload series bounded by the flags.
func newProxyMetrics(c *cli.Context, reg prometheus.Registerer) (*proxy.Metrics, error) {
	n, ttl := c.Int("metrics-upstreams"), c.Duration("metrics-series-ttl")
	if n < 1 {
		return nil, usage("--metrics-upstreams %d: expected 1 or more", n)
	}
	if ttl <= 0 {
		return nil, usage("--metrics-series-ttl %s: expected a positive duration, such as 5m", ttl)
	}
	pm, err := proxy.NewMetricsWith(reg, proxy.WorkloadOptions{UpstreamCap: n, TTL: ttl})
	if err != nil {
		return nil, cli.Exit(err.Error(), 1)
	}
	return pm, nil
}

// Paths served on the --metrics address besides /metrics: the probes of a
// DaemonSet or any supervisor.
const (
	// HealthPath answers 200 while the process serves HTTP (liveness).
	HealthPath = "/healthz"
	// ReadyPath answers 200 once the process does its job, 503 with the
	// reason before and while it stops (readiness).
	ReadyPath = "/readyz"
)

// serveMetrics serves reg's /metrics on addr until the returned server is
// closed, HealthPath and ReadyPath (ready nil: always ready), Go's
// profiles under /debug/pprof/ when withPprof is set, and page (the node
// page, nil: none) on every other path.
func serveMetrics(addr string, reg prometheus.Gatherer, log *slog.Logger, withPprof bool, ready func() error, page http.Handler) (*http.Server, error) {
	mln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, cli.Exit("--metrics: "+err.Error(), 1)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET "+HealthPath, func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET "+ReadyPath, func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		io.WriteString(w, "ok\n")
	})
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		log.Info("egret profiles", "addr", mln.Addr().String(), "path", "/debug/pprof/")
	}
	if page != nil {
		mux.Handle("/", page)
	}
	// Addr is the address bound (Serve ignores it): what a proxy must
	// not let its clients reach.
	ms := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, Addr: mln.Addr().String()}
	go ms.Serve(mln)
	log.Info("egret metrics", "addr", mln.Addr().String(), "path", "/metrics")
	if page != nil {
		log.Info("egret node page", "url", "http://"+mln.Addr().String()+"/")
	}
	return ms, nil
}

// heapFloorFlag sets the heap goal under which Go's collector does not run
// (internal/heapfloor). 16 MiB: about 3 times fewer collections than GOGC
// alone with egret's live heap of about 4 MiB, for at most 16 MiB more
// memory. 32 MiB took 6 % off the CPU per request at saturation, but put
// the bench's memory per idle connection (2000 of them, from none) over
// 16 KiB: the headroom is a fixed cost, divided there among connections.
var heapFloorFlag = &cli.StringFlag{Name: "heap-floor", Value: "16MiB", Usage: "let the heap grow to `SIZE` before Go's garbage collector runs: fewer collections, and fewer of their pauses, under load (0: GOGC alone; GOGC and GOMEMLIMIT still apply)"}

// startHeapFloor starts --heap-floor; call stop when the command ends.
func startHeapFloor(c *cli.Context) (stop func(), err error) {
	n, err := policy.ParseSize(c.String("heap-floor"))
	if err != nil {
		return nil, usage("--heap-floor: %v (0 for GOGC alone)", err)
	}
	return heapfloor.Start(uint64(n)), nil
}

// startProcess starts what every long-running command (proxy, agent, run)
// has: --heap-floor, and its logger writing request lines batched (no
// write(2) per line; written out within logFlushEvery, and at exit). Call
// stop when the command ends: it writes out the log, then ends the floor.
func startProcess(c *cli.Context) (log *slog.Logger, stop func(), err error) {
	stopFloor, err := startHeapFloor(c)
	if err != nil {
		return nil, nil, err
	}
	lw := newLogWriter(c.App.ErrWriter)
	stop = func() {
		lw.Close()
		stopFloor()
	}
	if log, err = newLogger(c, lw); err != nil {
		stop()
		return nil, nil, err
	}
	return log, stop, nil
}

// pprofFlag serves Go's profiles beside /metrics.
var pprofFlag = &cli.BoolFlag{Name: "pprof", Usage: "also serve Go's profiles under /debug/pprof/ on the --metrics address"}

// checkPprof refuses --pprof without a --metrics address to serve it on.
func checkPprof(c *cli.Context) error {
	if c.Bool("pprof") && c.String("metrics") == "" {
		return usage("--pprof needs --metrics ADDR (the profiles are served beside /metrics)")
	}
	return nil
}

// logQueryFlag keeps query strings in request log lines (proxy, agent, run).
var logQueryFlag = &cli.BoolFlag{Name: "log-query", Usage: "keep the query string of request URLs in log lines and traces (default: dropped, so that tokens in URLs do not reach log storage)"}

// raiseNoFile raises the soft RLIMIT_NOFILE to the hard limit (Go's
// runtime does so on Linux too; this says it, and does it wherever the
// runtime did not) and returns the soft limit in force: what the node
// agent's descriptor account is sized by.
func raiseNoFile() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur < rl.Max {
		want := rl
		want.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			return rl.Cur, err
		}
		rl = want
	}
	return rl.Cur, nil
}
