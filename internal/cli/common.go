package cli

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"
)

// newLogger builds the logger --log-format asks for, writing to w.
func newLogger(c *cli.Context, w io.Writer) (*slog.Logger, error) {
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(w, nil)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, nil)), nil
	}
	return nil, cli.Exit("--log-format must be text or json", 2)
}

// serveMetrics serves reg's /metrics on addr until the returned server is
// closed.
func serveMetrics(addr string, reg prometheus.Gatherer, log *slog.Logger) (*http.Server, error) {
	mln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, cli.Exit("--metrics: "+err.Error(), 1)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ms := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go ms.Serve(mln)
	log.Info("egret metrics", "addr", mln.Addr().String(), "path", "/metrics")
	return ms, nil
}
