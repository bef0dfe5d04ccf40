package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/retry"
	"github.com/egret-proxy/egret/witness"
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
			&cli.StringFlag{Name: "metrics", Usage: "serve Prometheus /metrics, the probes /healthz and /readyz, and the node page / on `ADDR` (default: off)"},
			&cli.StringFlag{Name: "admin", Usage: "serve the admin API on unix `SOCKET`, as the agent does: egret status, upstreams and explain --admin SOCKET ask it (default: off)"},
			pprofFlag,
			heapFloorFlag,
			&cli.DurationFlag{Name: "grace", Value: 10 * time.Second, Usage: "how long in-flight requests may take to finish on shutdown"},
			&cli.StringFlag{Name: "spool-dir", Usage: "directory for spooled request bodies (default: the system's temporary directory)"},
			logFormatFlag,
			logLevelFlag,
			accessLogFlag("all", "all by default: egret proxy is run by hand or in front of one client, where each request's line is what a person looks at"),
			metricsUpstreamsFlag,
			metricsTTLFlag,
			logQueryFlag,
			&cli.StringFlag{Name: "connect-ports", Value: "443", Usage: "comma-separated `PORTS` a CONNECT may reach"},
			&cli.DurationFlag{Name: "tunnel-idle-timeout", Value: proxy.DefaultTunnelIdleTimeout, Usage: "close a CONNECT tunnel silent both ways for this long"},
		},
		Action: runProxy,
	}
}

// checkListen refuses a listen address that is not HOST:PORT, saying what
// is expected, and a non-loopback one unless --allow-remote: only that
// refusal names --allow-remote.
func checkListen(flag, addr string, allow bool) error {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return usage("%s %s: expected HOST:PORT, such as 127.0.0.1:15001 or [::1]:15001", flag, addr)
	}
	err := proxy.CheckListen(addr, allow)
	if errors.Is(err, proxy.ErrRemoteListen) {
		return usage("%s %s: not a loopback address; pass --allow-remote to serve remote clients (an open proxy to whoever reaches it)", flag, addr)
	}
	if err != nil {
		return usage("%s %v", flag, err)
	}
	return nil
}

func runProxy(c *cli.Context) error {
	if c.NArg() > 0 {
		return usage("proxy takes no arguments")
	}
	if err := checkPprof(c); err != nil {
		return err
	}
	allow := c.Bool("allow-remote")
	listen := c.String("listen")
	if err := checkListen("--listen", listen, allow); err != nil {
		return err
	}
	metricsAddr := c.String("metrics")
	if metricsAddr != "" {
		if err := checkListen("--metrics", metricsAddr, allow); err != nil {
			return err
		}
	}
	connectPorts, err := parsePorts(c.String("connect-ports"))
	if err != nil {
		return cli.Exit("--connect-ports: "+err.Error(), 2)
	}
	log, stopProcess, err := startProcess(c)
	if err != nil {
		return err
	}
	defer stopProcess()
	access, err := accessLog(c)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pm, err := newProxyMetrics(c, reg)
	if err != nil {
		return err
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
			return policyFileError(f, err)
		}
		go w.Run(ctx)
		src, policyName = w, f
	}

	// The metrics (and pprof) address is served first, so that the proxy
	// knows the address bound and refuses to reach it for its clients.
	var ready atomic.Pointer[proxy.Server] // set once the proxy is made
	var ms *http.Server
	var protect []string
	var page lateHandler // the node page, once the server is made
	if metricsAddr != "" {
		isReady := func() error {
			if s := ready.Load(); s == nil || s.Draining() {
				return errors.New("draining")
			}
			return nil
		}
		if ms, err = serveMetrics(metricsAddr, reg, log, c.Bool("pprof"), isReady, &page); err != nil {
			return err
		}
		defer ms.Close()
		protect = append(protect, ms.Addr)
	}
	// Out of descriptors a new connection is refused at once rather
	// than left in the accept queue; egret keeps a reserve for itself.
	nofile, err := raiseNoFile()
	if err != nil {
		log.Warn("cannot raise the file descriptor limit", "limit", nofile, "err", err)
	}
	budgets := engine.NewBudgets()
	srv, err := proxy.New(proxy.Config{
		Quota:    proxy.NewQuota(proxy.Limits{}, proxy.NewFDs(int(min(nofile, 1<<30)), 0)),
		Mode:     proxy.Explicit,
		Shared:   proxy.Shared{Budgets: budgets, Witness: witness.TCPInfo{}, Tap: proxy.NewTap(0), Metrics: pm, RetryMetrics: rm, AccessLog: access, SpoolDir: c.String("spool-dir"), Via: "egret", LogQuery: c.Bool("log-query")},
		Policy:   src,
		Logger:   log,
		Bounds:   proxy.Bounds{ConnectPorts: connectPorts, Protect: protect},
		Timeouts: proxy.Timeouts{TunnelIdleTimeout: c.Duration("tunnel-idle-timeout")},
	})
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	ready.Store(srv)
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	st := &agent.Standalone{Server: srv, Budgets: budgets, Status: agent.ProxyStatus{
		Mode: "explicit", Listen: ln.Addr().String(), Policy: policyName, Started: time.Now()}}
	page.set(nodePage(st))
	if sock := c.String("admin"); sock != "" {
		actx, stopAdmin := context.WithCancel(context.Background())
		adminDone := make(chan struct{})
		go func() {
			defer close(adminDone)
			if err := agent.ServeAdminHandler(actx, sock, agent.WithAbout(agent.AdminHandler(st), version(), false)); err != nil {
				log.Error("admin API", "err", err)
			}
		}()
		// Stopped last, once the proxy has drained: explain answers
		// until then.
		defer func() { stopAdmin(); <-adminDone }()
		log.Info("egret admin API", "socket", sock)
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

// parsePorts reads a comma-separated list of TCP ports.
func parsePorts(s string) ([]int, error) {
	var ports []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("%q is not a port", f)
		}
		ports = append(ports, n)
	}
	return ports, nil
}
