package cli

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/egret-proxy/egret/internal/textlog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"
)

// newLogger builds the logger --log-format asks for, writing to w.
func newLogger(c *cli.Context, w io.Writer) (*slog.Logger, error) {
	switch c.String("log-format") {
	case "text":
		// slog's text format, written faster for the per-request lines.
		h, _ := textlog.New(w, nil)
		return slog.New(h), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, nil)), nil
	}
	return nil, cli.Exit("--log-format must be text or json", 2)
}

// serveMetrics serves reg's /metrics on addr until the returned server is
// closed, and Go's profiles under /debug/pprof/ when withPprof is set.
func serveMetrics(addr string, reg prometheus.Gatherer, log *slog.Logger, withPprof bool) (*http.Server, error) {
	mln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, cli.Exit("--metrics: "+err.Error(), 1)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		log.Info("egret profiles", "addr", mln.Addr().String(), "path", "/debug/pprof/")
	}
	ms := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go ms.Serve(mln)
	log.Info("egret metrics", "addr", mln.Addr().String(), "path", "/metrics")
	return ms, nil
}

// pprofFlag serves Go's profiles beside /metrics.
var pprofFlag = &cli.BoolFlag{Name: "pprof", Usage: "also serve Go's profiles under /debug/pprof/ on the --metrics address"}

// checkPprof refuses --pprof without a --metrics address to serve it on.
func checkPprof(c *cli.Context) error {
	if c.Bool("pprof") && c.String("metrics") == "" {
		return cli.Exit("--pprof needs --metrics ADDR (the profiles are served beside /metrics)", 2)
	}
	return nil
}
