package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/proxy/witness"
	"github.com/egret-proxy/egret/retry"
)

func proxyCommand() *cli.Command {
	return &cli.Command{
		Name:  "proxy",
		Usage: "run the retrying HTTP proxy in explicit mode (an HTTP_PROXY)",
		Description: "Clients send absolute-form requests (HTTP_PROXY=http://127.0.0.1:15001);\n" +
			"CONNECT is tunnelled without retries. Each answer carries Egret-Request-Id and\n" +
			"Egret-Attempts, and Egret-Outcome when no response could be relayed as it is.\n" +
			"SIGTERM or SIGINT drains: no new connections, no new retries, in-flight requests\n" +
			"finish within --grace; then egret exits 0.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:15001", Usage: "address to listen on (loopback unless --allow-remote)"},
			&cli.BoolFlag{Name: "allow-remote", Usage: "allow a non-loopback --listen or --metrics address (an open proxy to whoever reaches it)"},
			&cli.StringFlag{Name: "policy", Usage: "policy `FILE` (watched and reloaded on change; default: the embedded defaults)"},
			&cli.StringFlag{Name: "metrics", Usage: "serve Prometheus /metrics, and the probes /healthz and /readyz, on `ADDR` (default: off)"},
			pprofFlag,
			heapFloorFlag,
			&cli.DurationFlag{Name: "grace", Value: 10 * time.Second, Usage: "how long in-flight requests may take to finish on shutdown"},
			&cli.StringFlag{Name: "spool-dir", Usage: "directory for spooled request bodies (default: the system's temporary directory)"},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format: text or json"},
		},
		Action: runProxy,
	}
}

func runProxy(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit("proxy takes no arguments", 2)
	}
	if err := checkPprof(c); err != nil {
		return err
	}
	allow := c.Bool("allow-remote")
	listen := c.String("listen")
	if err := proxy.CheckListen(listen, allow); err != nil {
		return cli.Exit(err.Error()+"; pass --allow-remote to accept it", 2)
	}
	metricsAddr := c.String("metrics")
	if metricsAddr != "" {
		if err := proxy.CheckListen(metricsAddr, allow); err != nil {
			return cli.Exit("--metrics: "+err.Error(), 2)
		}
	}
	stopFloor, err := startHeapFloor(c)
	if err != nil {
		return err
	}
	defer stopFloor()
	// One line per request: batched, so that logging does not cost a
	// write(2) per request (written out within logFlushEvery, and at exit).
	lw := newLogWriter(c.App.ErrWriter)
	defer lw.Close()
	log, err := newLogger(c, lw)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pm, err := proxy.NewMetrics(reg)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	rm, err := retry.NewMetrics(reg)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var src proxy.PolicySource = proxy.StaticPolicy{P: policy.Default()}
	policyName := "embedded defaults"
	if f := c.String("policy"); f != "" {
		w, err := policy.NewWatcher(f, log, reg)
		if err != nil {
			return cli.Exit(fmt.Sprintf("policy: %v", err), 2)
		}
		go w.Run(ctx)
		src, policyName = w, f
	}

	// Out of descriptors a new connection is refused at once rather
	// than left in the accept queue; egret keeps a reserve for itself.
	nofile, err := raiseNoFile()
	if err != nil {
		log.Warn("cannot raise the file descriptor limit", "limit", nofile, "err", err)
	}
	srv, err := proxy.New(proxy.Config{
		Quota:        proxy.NewQuota(proxy.Limits{}, proxy.NewFDs(int(min(nofile, 1<<30)), 0)),
		Mode:         proxy.Explicit,
		Policy:       src,
		Witness:      witness.TCPInfo{},
		Metrics:      pm,
		RetryMetrics: rm,
		Logger:       log,
		SpoolDir:     c.String("spool-dir"),
		Via:          "egret",
	})
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	var ms *http.Server
	if metricsAddr != "" {
		ready := func() error {
			if srv.Draining() {
				return errors.New("draining")
			}
			return nil
		}
		if ms, err = serveMetrics(metricsAddr, reg, log, c.Bool("pprof"), ready); err != nil {
			ln.Close()
			return err
		}
	}
	log.Info("egret proxy listening", "addr", ln.Addr().String(), "mode", "explicit", "policy", policyName)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return cli.Exit(fmt.Sprintf("serve: %v", err), 1)
	case <-ctx.Done():
	}
	log.Info("egret proxy draining", "grace", c.Duration("grace"))
	sctx, cancel := context.WithTimeout(context.Background(), c.Duration("grace"))
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("egret proxy drained with requests cut short", "err", err)
	}
	if ms != nil {
		ms.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, proxy.ErrServerClosed) {
		log.Warn("serve", "err", err)
	}
	log.Info("egret proxy stopped")
	return nil
}
