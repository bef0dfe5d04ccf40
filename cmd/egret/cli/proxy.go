package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/proxy"
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
	fl, err := readProxyFlags(c)
	if err != nil {
		return err
	}
	log, stopProcess, err := startProcess(c)
	if err != nil {
		return err
	}
	defer stopProcess()
	shared, err := sharedSettings(c)
	if err != nil {
		return err
	}
	reg := newRegistry()
	if shared.Metrics, err = newProxyMetrics(c, reg); err != nil {
		return err
	}
	shared.SpoolDir, shared.Via = c.String("spool-dir"), "egret"
	if shared, err = proxy.NewShared(reg, shared); err != nil {
		return cli.Exit(err.Error(), 1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pol, policyName, err := watchPolicy(ctx, c, log, reg)
	if err != nil {
		return err
	}
	// The metrics (and pprof) address is served first, so that the proxy
	// knows the address bound and refuses to reach it for its clients.
	front, err := serveFront(c, fl.metrics, reg, log)
	if err != nil {
		return err
	}
	defer front.close()
	shared.FDs, _ = descriptors(log, 0)
	srv, err := proxy.New(proxy.Config{
		Mode:     proxy.Explicit,
		Policy:   pol,
		Logger:   log,
		Shared:   shared,
		Timeouts: proxy.Timeouts{TunnelIdleTimeout: c.Duration("tunnel-idle-timeout")},
		Bounds:   proxy.Bounds{ConnectPorts: fl.connectPorts, Protect: front.protect()},
	})
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	front.ready.Store(srv)
	ln, err := net.Listen("tcp", fl.listen)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	st := &agent.Standalone{Server: srv, Budgets: shared.Budgets, Status: agent.ProxyStatus{
		Mode: "explicit", Listen: ln.Addr().String(), Policy: policyName, Started: time.Now()}}
	front.page.set(nodePage(st))
	// Stopped last, once the proxy has drained: explain answers until then.
	defer serveStandaloneAdmin(c.String("admin"), st, log)()
	log.Info("egret proxy listening", "addr", ln.Addr().String(), "mode", "explicit", "policy", policyName)
	return serveUntil(ctx, c.Duration("grace"), log, srv, ln, front)
}

// proxyFlags are egret proxy's addresses and ports, checked.
type proxyFlags struct {
	listen, metrics string
	connectPorts    []int
}

func readProxyFlags(c *cli.Context) (proxyFlags, error) {
	if c.NArg() > 0 {
		return proxyFlags{}, usage("proxy takes no arguments")
	}
	if err := checkPprof(c); err != nil {
		return proxyFlags{}, err
	}
	allow := c.Bool("allow-remote")
	fl := proxyFlags{listen: c.String("listen"), metrics: c.String("metrics")}
	if err := checkListen("--listen", fl.listen, allow); err != nil {
		return proxyFlags{}, err
	}
	if fl.metrics != "" {
		if err := checkListen("--metrics", fl.metrics, allow); err != nil {
			return proxyFlags{}, err
		}
	}
	ports, err := parsePorts(c.String("connect-ports"))
	if err != nil {
		return proxyFlags{}, cli.Exit("--connect-ports: "+err.Error(), 2)
	}
	fl.connectPorts = ports
	return fl, nil
}

// proxyFront is egret proxy's --metrics address (the metrics, probes and
// node page), served before the proxy is made: ready when the proxy is,
// the page once it is set.
type proxyFront struct {
	ms    *http.Server // nil without --metrics
	ready atomic.Pointer[proxy.Server]
	page  lateHandler
}

func serveFront(c *cli.Context, addr string, reg prometheus.Gatherer, log *slog.Logger) (*proxyFront, error) {
	f := &proxyFront{}
	if addr == "" {
		return f, nil
	}
	isReady := func() error {
		if s := f.ready.Load(); s == nil || s.Draining() {
			return errors.New("draining")
		}
		return nil
	}
	ms, err := serveMetrics(addr, reg, log, c.Bool("pprof"), isReady, &f.page)
	if err != nil {
		return nil, err
	}
	f.ms = ms
	return f, nil
}

// protect is the address the proxy must keep its clients from.
func (f *proxyFront) protect() []string {
	if f.ms == nil {
		return nil
	}
	return []string{f.ms.Addr}
}

func (f *proxyFront) close() {
	if f.ms != nil {
		f.ms.Close()
	}
}

// serveStandaloneAdmin serves the admin API of a lone proxy on sock ("":
// none) and returns what stops it.
func serveStandaloneAdmin(sock string, st *agent.Standalone, log *slog.Logger) (stop func()) {
	if sock == "" {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := agent.ServeAdminHandler(ctx, sock, agent.WithAbout(agent.AdminHandler(st), version(), false)); err != nil {
			log.Error("admin API", "err", err)
		}
	}()
	log.Info("egret admin API", "socket", sock)
	return func() { cancel(); <-done }
}

// serveUntil serves ln until ctx ends, then drains the proxy for up to
// grace and closes the front (its readiness said draining until then).
func serveUntil(ctx context.Context, grace time.Duration, log *slog.Logger, srv *proxy.Server, ln net.Listener, front *proxyFront) error {
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return cli.Exit(fmt.Sprintf("serve: %v", err), 1)
	case <-ctx.Done():
	}
	log.Info("egret proxy draining", "grace", grace)
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("egret proxy drained with requests cut short", "err", err)
	}
	front.close()
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
