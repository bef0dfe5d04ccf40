package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/egret-proxy/egret/agent/services"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/keeper"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/agent/pods/kube"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
)

func agentCommand() *cli.Command {
	return &cli.Command{
		Name:  "agent",
		Usage: "run the node agent: put the pods of a pods file, or this node's annotated Kubernetes pods, behind egret with eBPF",
		Description: "For each pod (a cgroup v2 and a network namespace) the agent opens\n" +
			"egret's listener inside the pod's namespace, runs a transparent proxy on it that\n" +
			"dials upstreams from the same namespace, and attaches egret's eBPF programs to the\n" +
			"pod's cgroup so that its outbound TCP connects go to that listener. The pods come\n" +
			"from --pods (a YAML file, reloaded on change) or --kubernetes (the pods of this\n" +
			"node annotated egret.dev/enabled: \"true\", watched; see agent/pods/kube). Needs root\n" +
			"and a kernel with cgroup v2, BTF and the eBPF program types named in errors;\n" +
			"--kubernetes also needs the host's PID namespace (hostPID) to find the pods'\n" +
			"network namespaces.\n\n" +
			"SIGTERM or SIGINT: the kernel stops redirecting the pods (their connects go direct),\n" +
			"the listeners close, in-flight requests finish within --grace, and the pinned eBPF\n" +
			"state stays for the next agent to adopt (--cleanup removes it instead). If the agent\n" +
			"dies, pods' new connects go direct the same way; with --keeper, connects queued on\n" +
			"its listeners stay queued in `egret keeper` for the next agent to serve.\n\n" +
			"Subcommands ask a running agent over its admin socket.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "pods", Usage: "pods `FILE` (YAML; see agent/pods/README.md); or --kubernetes"},
			&cli.StringFlag{Name: "policy", Usage: "policy `FILE` for every pod (watched; default: the embedded defaults)"},
			&cli.StringFlag{Name: "pin-dir", Value: bpfload.DefaultPinDir, Usage: "bpffs `DIR` for egret's maps and links"},
			&cli.UintFlag{Name: "listen-port", Value: agent.DefaultListenPort, Usage: "`PORT` of each pod's listeners on 127.0.0.1 and ::1 in its namespace"},
			&cli.StringFlag{Name: "cgroup", Usage: "egret's own cgroup v2 `DIR` (default: the current one if the agent is alone in it and it is not the root, else " + agent.DefaultSelfCgroup + " for the default --pin-dir and egret-agent-NAME-HASH beside it for another)"},
			&cli.StringFlag{Name: "admin", Value: agent.DefaultAdminSocket, Usage: "unix `SOCKET` of the admin API (\"\" for none)"},
			&cli.StringFlag{Name: "metrics", Usage: "serve Prometheus /metrics, the probes /healthz and /readyz, and the node page / on `ADDR` (default: off)"},
			pprofFlag,
			heapFloorFlag,
			&cli.DurationFlag{Name: "grace", Value: 5 * time.Second, Usage: "how long in-flight requests may take on shutdown"},
			&cli.BoolFlag{Name: "cleanup", Usage: "on exit, detach every pod and unpin egret's state instead of leaving it for the next agent"},
			logFormatFlag,
			logLevelFlag,
			accessLogFlag("errors", "errors by default: a node agent serves every pod of its node, and a line for each success (some 24 GB a day at 1,000 requests/s) would bury the few that need a look; the metrics count every request"),
			metricsUpstreamsFlag,
			metricsTTLFlag,
			logQueryFlag,
			&cli.IntFlag{Name: "pod-max-connections", Usage: "client connections a pod may hold at once, unless it sets its own (default: a quarter of what the descriptors allow, at most 1024)"},
			&cli.IntFlag{Name: "pod-max-in-flight", Usage: "requests a pod may have in flight at once, unless it sets its own (default 256)"},
			&cli.StringFlag{Name: "pod-max-spool-bytes", Usage: "request-body `SIZE` a pod may have held for replays at once, unless it sets its own (default 64MiB)"},
			&cli.StringFlag{Name: "keeper", Usage: "unix `SOCKET` of `egret keeper`: hand it the pods' listeners, and adopt those it kept for an earlier agent (default: none)"},
			&cli.IntFlag{Name: "fd-reserve", Usage: "file descriptors kept for egret itself, out of pods' reach (default: 128, or an eighth of the limit)"},
		}, agentKubeFlags()...),
		Action:      runAgent,
		Subcommands: adminCommands(),
	}
}

// kernelError turns a loader error into the message and status the
// commands exit with: what is missing, exactly.
func kernelError(err error) error {
	switch {
	case errors.Is(err, bpfload.ErrNotRoot):
		return cli.Exit("needs root: loading eBPF programs and attaching them to cgroups needs euid 0 (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN); run it with sudo", 1)
	case errors.Is(err, bpfload.ErrFeature):
		return cli.Exit(err.Error(), 1)
	}
	return cli.Exit(fmt.Sprintf("eBPF: %v", err), 1)
}

func runAgent(c *cli.Context) error {
	if err := checkAgentArgs(c); err != nil {
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
	if os.Geteuid() != 0 {
		return kernelError(bpfload.ErrNotRoot)
	}
	port, podLimits, err := readAgentFlags(c)
	if err != nil {
		return err
	}
	fds := podDescriptors(c, log, podLimits)
	// What the pod source reports goes to the agent (made below, before
	// the source runs).
	var a *agent.Agent
	ps, err := openPodSource(c, log, func(err error) { a.SourceError(err) })
	if err != nil {
		return err
	}
	defer ps.stop()
	if err := bpfload.Probe(); err != nil {
		return kernelError(err)
	}
	reg := newRegistry()
	if shared.Metrics, err = newProxyMetrics(c, reg); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var gone agent.GoneEndpoints
	shared.Services, gone = ps.watchServices(ctx)
	pol, _, err := watchPolicy(ctx, c, log, reg)
	if err != nil {
		return err
	}
	node, err := enterNode(c, log)
	if err != nil {
		return err
	}
	defer node.closeKeeper()
	a, err = agent.New(agent.Config{
		Attacher:      node.l,
		Source:        ps.src,
		SelfCgroup:    node.cg.self,
		Mark:          node.l.Mark(),
		Witness:       node.l.Witness(),
		ListenPort:    uint16(port),
		Policy:        pol,
		Proxy:         proxy.Config{Shared: shared},
		Endpoints:     gone,
		ShutdownGrace: c.Duration("grace"),
		CleanupOnExit: c.Bool("cleanup"),
		Reporter:      ps.reporter,
		Keeper:        node.keeper(),
		Kept:          node.kept,
		PodLimits:     podLimits,
		FDs:           fds,
		Logger:        log,
		Registerer:    reg,
	})
	if err != nil {
		node.l.Close()
		return cli.Exit(err.Error(), 1)
	}
	ps.tell(a, log)
	closeMetrics, err := serveAgentAPIs(ctx, c, a, reg, log)
	if err != nil {
		node.l.Close()
		return err
	}
	defer closeMetrics()
	log.Info("egret agent running", append(ps.desc, "pin_dir", node.l.PinDir(),
		"cgroup", node.cg.self, "listen_port", port, "adopted_pods", node.adopted, "admin", c.String("admin"))...)
	cleanup, runErr := runAgentUntil(ctx, a, ps.install, c.Bool("cleanup"), log)
	node.release(cleanup, log)
	if runErr != nil {
		return cli.Exit(runErr.Error(), 1)
	}
	return nil
}

// checkAgentArgs refuses arguments (but the subcommands), --pprof without
// --metrics and anything but one pod source.
func checkAgentArgs(c *cli.Context) error {
	if c.NArg() > 0 {
		return unknownCommand("egret agent", c.Command.Subcommands, c.Args().First())
	}
	if err := checkPprof(c); err != nil {
		return err
	}
	return checkPodSource(c)
}

// readAgentFlags reads --listen-port and the limits of pods that set
// none of their own.
func readAgentFlags(c *cli.Context) (uint, proxy.Limits, error) {
	port := c.Uint("listen-port")
	if port == 0 || port > 65535 {
		return 0, proxy.Limits{}, usage("--listen-port %d: expected a port number, 1 to 65535", port)
	}
	podLimits := proxy.Limits{Conns: c.Int("pod-max-connections"), InFlight: c.Int("pod-max-in-flight")}
	if podLimits.Conns < 0 || podLimits.InFlight < 0 || c.Int("fd-reserve") < 0 {
		return 0, proxy.Limits{}, cli.Exit("--pod-max-connections, --pod-max-in-flight and --fd-reserve cannot be negative", 2)
	}
	if v := c.String("pod-max-spool-bytes"); v != "" {
		n, err := policy.ParseSize(v)
		if err != nil {
			return 0, proxy.Limits{}, cli.Exit("--pod-max-spool-bytes: "+err.Error(), 2)
		}
		podLimits.SpoolBytes = n
	}
	return port, podLimits, nil
}

// podDescriptors is the account of the descriptors the pods may take,
// --fd-reserve kept for egret, and says how it is shared.
func podDescriptors(c *cli.Context, log *slog.Logger, podLimits proxy.Limits) *proxy.FDs {
	fds, nofile := descriptors(log, c.Int("fd-reserve"))
	defConns := podLimits.Conns
	if defConns == 0 {
		defConns = fds.FairShare()
	}
	log.Info("file descriptors", "limit", nofile, "for_pods", fds.Capacity(), "pod_connections", defConns)
	return fds
}

// podSource is where the agent's pods come from, a pods file (--pods) or
// the Kubernetes API (--kubernetes), and what comes with the latter.
type podSource struct {
	src  pods.Source
	file *pods.File // --pods
	desc []any      // what the agent's start line says of it
	// install tells an uninstall from a restart (nil: it cannot);
	// reporter records Events on the pods; svcs, filled by svcWatch, are
	// the node's Services.
	install  *kube.Install
	reporter agent.Reporter
	svcs     *services.Table
	svcWatch *services.Watcher
	stop     func()
}

func openPodSource(c *cli.Context, log *slog.Logger, onError func(error)) (*podSource, error) {
	if !c.Bool("kubernetes") {
		file, err := pods.NewFile(c.String("pods"))
		if err != nil {
			return nil, cli.Exit(err.Error(), 2)
		}
		return &podSource{src: file, file: file, desc: []any{"pods_file", file.Path(), "pods", len(file.Pods())}, stop: func() {}}, nil
	}
	svcs, svcWatch, err := kubeServices(c, log)
	if err != nil {
		return nil, err
	}
	ks, desc, stopRec, install, err := kubeSource(c, log, onError)
	if err != nil {
		return nil, err
	}
	stop := func() {
		if install != nil {
			install.Close()
		}
		stopRec()
	}
	return &podSource{src: ks, desc: desc, install: install, reporter: ks, svcs: svcs, svcWatch: svcWatch, stop: stop}, nil
}

// watchServices fills the node's table of Services until ctx ends; it is
// what attributes the pods' requests to Services and tells the agent of
// the endpoints that left them (both nil without --kubernetes).
func (ps *podSource) watchServices(ctx context.Context) (proxy.Services, agent.GoneEndpoints) {
	if ps.svcs == nil {
		return nil, nil
	}
	go ps.svcWatch.Run(ctx)
	return ps.svcs, ps.svcs
}

// tell makes a pods file report its errors and reloads to the agent.
func (ps *podSource) tell(a *agent.Agent, log *slog.Logger) {
	if ps.file != nil {
		ps.file.OnError = a.SourceError
		ps.file.OnReload = func(n int) { log.Info("pods file reloaded", "pods", n) }
	}
}

// agentCgroup is egret's own cgroup, entered: --cgroup, or one of its own.
type agentCgroup struct {
	orig, self string
	made       bool // it did not exist before: the agent made it
}

func enterAgentCgroup(c *cli.Context) (agentCgroup, error) {
	orig, err := agent.CurrentCgroup()
	if err != nil {
		return agentCgroup{}, cli.Exit(err.Error(), 1)
	}
	self := c.String("cgroup")
	_, statErr := os.Stat(self)
	if self == "" {
		fallback := agent.SelfCgroupFor(c.String("pin-dir"))
		_, statErr = os.Stat(fallback)
		self, err = agent.EnterSelfCgroup(fallback)
	} else {
		err = agent.EnterCgroup(self)
	}
	if err != nil {
		return agentCgroup{}, cli.Exit(err.Error(), 1)
	}
	return agentCgroup{orig: orig, self: self, made: errors.Is(statErr, os.ErrNotExist)}, nil
}

// leave leaves the cgroup the agent made, and removes it.
func (g agentCgroup) leave() {
	if g.self != g.orig && g.made {
		if err := agent.EnterCgroup(g.orig); err == nil {
			_ = os.Remove(g.self)
		}
	}
}

// agentNode is egret's eBPF state, loaded or adopted from an earlier agent,
// the listeners `egret keeper` kept for it, and egret's own cgroup.
type agentNode struct {
	cg      agentCgroup
	l       *bpfload.Loader
	kc      *keeper.Client // nil without --keeper
	kept    map[string]*os.File
	adopted int // pods attached by an earlier agent
}

// enterNode enters egret's own cgroup, then loads (or adopts) its eBPF
// state and takes the listeners kept for it.
func enterNode(c *cli.Context, log *slog.Logger) (*agentNode, error) {
	cg, err := enterAgentCgroup(c)
	if err != nil {
		return nil, err
	}
	l, err := bpfload.Load(bpfload.Options{PinDir: c.String("pin-dir")})
	if err != nil {
		return nil, kernelError(err)
	}
	kc, kept, err := dialKeeper(c, log)
	if err != nil {
		l.Close()
		return nil, err
	}
	adopted, _ := l.Pods()
	for _, s := range l.Stale() {
		log.Info("removed pinned eBPF state of a cgroup that is gone", "kind", s.Kind, "cgroup_id", s.ID)
	}
	return &agentNode{cg: cg, l: l, kc: kc, kept: kept, adopted: len(adopted)}, nil
}

// keeper is the agent's ListenerKeeper (nil without --keeper).
func (n *agentNode) keeper() agent.ListenerKeeper {
	if n.kc == nil {
		return nil
	}
	return n.kc
}

func (n *agentNode) closeKeeper() {
	if n.kc != nil {
		n.kc.Close()
	}
}

// release removes the pinned state and the cgroup the agent made
// (cleanup), or leaves them for the next agent, and says which.
func (n *agentNode) release(cleanup bool, log *slog.Logger) {
	if cleanup {
		if err := n.l.Remove(); err != nil {
			log.Error("remove pinned state", "err", err)
		}
		log.Info("egret agent stopped; eBPF state removed")
	} else {
		log.Info("egret agent stopped; pinned eBPF state left for the next agent (pods go direct meanwhile)", "pin_dir", n.l.PinDir())
	}
	n.l.Close()
	if cleanup {
		n.cg.leave()
	}
}

// serveAgentAPIs serves the admin API on --admin until ctx ends, and
// --metrics until closeMetrics.
func serveAgentAPIs(ctx context.Context, c *cli.Context, a *agent.Agent, reg prometheus.Gatherer, log *slog.Logger) (closeMetrics func(), err error) {
	if sock := c.String("admin"); sock != "" {
		go func() {
			if err := agent.ServeAdminHandler(ctx, sock, agent.WithAbout(a.Admin(), version(), true)); err != nil {
				log.Error("admin API", "err", err)
			}
		}()
	}
	addr := c.String("metrics")
	if addr == "" {
		return func() {}, nil
	}
	ms, err := serveMetrics(addr, reg, log, c.Bool("pprof"), a.Ready, nodePage(a))
	if err != nil {
		return nil, err
	}
	return func() { ms.Close() }, nil
}

// runAgentUntil runs the agent until the signal (ctx); then, unless
// --cleanup says already, its DaemonSet tells whether this is an
// uninstall (remove the pinned state: cleanup) or a restart (leave it for
// the next agent).
func runAgentUntil(ctx context.Context, a *agent.Agent, install *kube.Install, cleanup bool, log *slog.Logger) (bool, error) {
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	decided := make(chan struct{})
	go func() {
		defer close(decided)
		select {
		case <-ctx.Done():
		case <-runCtx.Done():
			return
		}
		if !cleanup && install != nil {
			removed, why := install.Removed(context.Background())
			if removed {
				cleanup = true
				a.SetCleanupOnExit(true)
				log.Info("egret is being uninstalled: removing its eBPF state", "why", why)
			} else {
				log.Info("restart, not uninstall: the pinned eBPF state stays for the next agent", "why", why)
			}
		}
		stopRun()
	}()
	runErr := a.Run(runCtx)
	stopRun()
	<-decided
	return cleanup, runErr
}

// adminCommands ask a running agent, over its admin socket.
func adminCommands() []*cli.Command {
	sock := &cli.StringFlag{Name: "admin", Value: agent.DefaultAdminSocket, Usage: "the admin `SOCKET` of the agent, or of egret proxy --admin"}
	get := func(name, help, path string) *cli.Command {
		return &cli.Command{
			Name:  name,
			Usage: help,
			Flags: []cli.Flag{sock, outputFlag},
			Action: func(c *cli.Context) error {
				if c.NArg() > 0 {
					return usage("%s takes no arguments", name)
				}
				body, err := adminGet(c.String("admin"), path)
				if err != nil {
					return err
				}
				return printQuery(c, name, body) // output.go
			},
		}
	}
	return []*cli.Command{
		get("status", "the agent's (or proxy's) summary, version, kernel and eBPF features", "/status"),
		get("pods", "the pods and their state", "/pods"),
		get("upstreams", "the node-wide retry budget of each upstream in use (one idle past its TTL is forgotten: egret top shows it as -)", "/upstreams"),
		observeCommand(sock), policyCommand(sock),
		{
			Name:      "explain",
			Usage:     "what egret did with one request, by its Egret-Request-Id",
			ArgsUsage: "REQUEST-ID",
			Flags:     []cli.Flag{sock, outputFlag, &cli.BoolFlag{Name: "json", Usage: "print the trace as JSON (-o json)"}},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return usage("explain needs one REQUEST-ID (the Egret-Request-Id of an answer, such as 8e13ac3b035fce95)")
				}
				id := c.Args().First()
				if !requestID.MatchString(id) {
					return usage("explain %q: expected a request id, the 16 hex digits of an Egret-Request-Id such as 8e13ac3b035fce95", id)
				}
				body, err := adminGet(c.String("admin"), "/explain/"+url.PathEscape(id))
				if err != nil {
					return err
				}
				format, err := outputFormat(c)
				if err != nil {
					return err
				}
				if c.Bool("json") || format == outputJSON {
					_, err = c.App.Writer.Write(body)
					return err
				}
				var tv agent.TraceView
				if err := json.Unmarshal(body, &tv); err != nil {
					return cli.Exit(err.Error(), 1)
				}
				writeExplain(c.App.Writer, tv)
				return nil
			},
		},
	}
}

// requestID is the form of an Egret-Request-Id: nothing else goes into
// the admin API's path.
var requestID = regexp.MustCompile(`^[0-9a-f]{16}$`)

// adminError says, in egret's words, why the admin socket did not answer:
// which socket, what went wrong, and what to check (the HTTP request
// under it is egret's business, not the user's).
func adminError(sock string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err
		var se *os.SyscallError
		if errors.As(err, &se) {
			err = se.Err
		}
	}
	check := "is egret agent, or egret proxy --admin " + sock + ", running? --admin names another socket"
	switch {
	case errors.Is(err, syscall.ENOENT):
		check = "no such socket: " + check
	case errors.Is(err, syscall.ECONNREFUSED):
		check = "nothing listens on it (an egret that stopped without removing it?): " + check
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		check = "permission denied: the socket is root's; run as root"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		check = "no answer in time: egret may be overloaded or stuck"
	default:
		check = err.Error() + ": " + check
	}
	return cli.Exit(fmt.Sprintf("cannot ask egret at admin socket %s: %s", sock, check), ExitFailure)
}

func adminGet(sock, path string) ([]byte, error) {
	resp, err := agent.AdminClient(sock).Get("http://egret" + path)
	if err != nil {
		return nil, adminError(sock, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, cli.Exit(err.Error(), 1)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		_ = json.Unmarshal(body, &e)
		return nil, cli.Exit(strings.TrimSpace(e.Error), 1)
	}
	return body, nil
}

func writeExplain(w io.Writer, tv agent.TraceView) {
	from := ""
	if tv.Pod != "" {
		from = " from pod " + tv.Pod
	}
	fmt.Fprintf(w, "request %s%s: %s %s to %s (idempotent %v, body %s) -> outcome %s after %d attempt(s)\n",
		tv.RequestID, from, tv.Method, tv.URL, tv.Upstream, tv.Idempotent, tv.Body, outcomeOr(tv.Outcome), len(tv.Attempts))
	if tv.Note != "" {
		fmt.Fprintf(w, "  note: %s\n", tv.Note)
	}
	for _, a := range tv.Attempts {
		what := fmt.Sprintf("status %d", a.Status)
		if a.Status == 0 {
			what = fmt.Sprintf("%s at %s", a.Failure, a.Stage)
		}
		fmt.Fprintf(w, "  attempt %d: %s in %.1f ms; evidence %s", a.N, what, a.DurationMs, a.Evidence)
		if a.Endpoint != "" {
			fmt.Fprintf(w, "; endpoint %s", a.Endpoint)
		}
		if a.Upgraded {
			fmt.Fprint(w, " (upgraded by the witness")
			if a.Proof == "ended_before_ack" {
				fmt.Fprint(w, ": the upstream's FIN acked no byte of the request, then it reset them")
			}
			fmt.Fprint(w, ")")
		}
		fmt.Fprintf(w, "; decision %s/%s", a.Decision, a.Reason)
		if a.Budget != nil {
			fmt.Fprintf(w, "; budget %.1f", *a.Budget)
		}
		fmt.Fprintln(w)
		if wa := a.WitnessAfter; wa != nil {
			wb := a.WitnessBefore
			if wb == nil {
				wb = &agent.CountersView{}
			}
			// The kernel's bytes acked (tcpi_bytes_acked) counts the
			// SYN and the FIN as a byte each: 265 sent is 266 acked.
			fmt.Fprintf(w, "    witness (%s): bytes sent %s -> %s, data segments %s -> %s, acked %d -> %d (+1 each for SYN and FIN), retransmits %d, reset %v\n",
				wa.Source, count(wb.BytesSent), count(wa.BytesSent), count(wb.DataSegsOut),
				count(wa.DataSegsOut), wb.BytesAcked, wa.BytesAcked, wa.Retransmits, wa.ResetReceived)
		}
		if a.Reused || a.IdleBound != nil {
			conn := "a new connection"
			if a.Reused {
				conn = fmt.Sprintf("a pooled connection idle %.1f ms", a.IdleMs)
			}
			fmt.Fprintf(w, "    connection: %s", conn)
			if b := a.IdleBound; b != nil {
				fmt.Fprintf(w, "; idle bound %.1f ms for requests that are not idempotent (%s: %.1f ms)", b.LimitMs, b.Source, b.SeenMs)
			}
			fmt.Fprintln(w)
		}
		if a.Err != "" {
			fmt.Fprintf(w, "    error: %s\n", a.Err)
		}
	}
}

// count is a witness counter, "?" when it was not read.
func count(v *uint64) string {
	if v == nil {
		return "?"
	}
	return strconv.FormatUint(*v, 10)
}

func outcomeOr(o string) string {
	if o == "" {
		return "relayed"
	}
	return o
}
