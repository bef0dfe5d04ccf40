package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/netns"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run a command with its outbound TCP connections transparently behind egret",
		ArgsUsage: "-- CMD [ARGS...]",
		Description: "Starts CMD in a fresh cgroup v2 that egret's eBPF programs redirect (loopback\n" +
			"destinations included), with an agent for it alone, so that a plain client such as\n" +
			"curl gets egret's truthful retries without knowing it (answers carry Egret-Attempts).\n" +
			"--netns host (default) keeps the host's network namespace; --netns new gives CMD a\n" +
			"namespace of its own, joined to the host by a veth pair (10.254.x.y/30): CMD finds\n" +
			"the host's end in $EGRET_HOST, its default route. Everything egret set up is\n" +
			"removed when CMD exits; egret exits with CMD's status. Needs root.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "netns", Value: "host", Usage: "network namespace of CMD: host or new"},
			&cli.StringFlag{Name: "policy", Usage: "policy `FILE` (default: the embedded defaults)"},
			&cli.UintFlag{Name: "listen-port", Usage: "`PORT` of egret's listener (default: a free one)"},
			logFormatFlag,
			logLevelFlag,
			accessLogFlag("all", "all by default: egret run puts one command behind egret, and its requests' lines are what a person runs it to see"),
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "log only warnings and errors (--log-level warn)"},
			logQueryFlag,
			heapFloorFlag,
		},
		Action: runRun,
	}
}

func randSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func runRun(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) == 0 {
		return usage("run needs a command: egret run [--netns host|new] -- CMD [ARGS...]")
	}
	log, stopProcess, err := startProcess(c)
	if err != nil {
		return err
	}
	defer stopProcess()
	if c.Bool("quiet") {
		log = slog.New(levelHandler{slog.LevelWarn, log.Handler()})
	}
	shared, err := sharedSettings(c)
	if err != nil {
		return err
	}
	mode := c.String("netns")
	if mode != "host" && mode != "new" {
		return usage("--netns %s: expected host or new", mode)
	}
	if err := findCommand(args[0]); err != nil {
		return err
	}
	if err := bpfload.Probe(); err != nil {
		return kernelError(err)
	}
	pol, err := loadPolicy(c.String("policy"))
	if err != nil {
		return err
	}

	collectStaleRuns(log, nil)
	r := &runEnv{name: runPrefix + randSuffix(), log: log}
	defer r.cleanup()
	if r.lock, err = lockRun(r.name); err != nil {
		return cli.Exit(err.Error(), 1)
	}
	if err := r.setup(mode); err != nil {
		return cli.Exit(err.Error(), 1)
	}
	if err := r.startAgent(uint16(c.Uint("listen-port")), pol, shared); err != nil {
		return err
	}
	cmd, err := r.startCommand(args)
	if err != nil {
		return err
	}
	defer relaySignals(cmd.Process)()
	code, err := exitCode(cmd.Wait())
	if err != nil {
		return err
	}
	r.cleanup()
	if code != 0 {
		return cli.Exit("", code)
	}
	return nil
}

// loadPolicy is the policy of file, read once ("": the embedded
// defaults).
func loadPolicy(file string) (proxy.PolicySource, error) {
	if file == "" {
		return proxy.StaticPolicy{P: policy.Default()}, nil
	}
	p, err := policy.Load(file)
	if err != nil {
		return nil, policyFileError(file, err)
	}
	return proxy.StaticPolicy{P: p}, nil
}

// startAgent loads egret's eBPF programs for the run and starts an agent
// whose one pod is the command's cgroup, listening on port (0: a free
// one), and waits for the pod to run.
func (r *runEnv) startAgent(port uint16, pol proxy.PolicySource, shared proxy.Shared) error {
	if port == 0 {
		if err := r.ns.Do(func() error {
			var err error
			port, err = agent.FreeListenPort()
			return err
		}); err != nil {
			return cli.Exit(err.Error(), 1)
		}
	}
	var err error
	r.loader, err = bpfload.Load(bpfload.Options{PinDir: filepath.Join(bpfload.BPFFSRoot, r.name)})
	if err != nil {
		return kernelError(err)
	}
	pod := pods.Pod{Name: "run", Cgroup: r.cmdCg, Netns: r.nsPath, ListenPort: port, RedirectLoopback: true}
	src, err := pods.NewMemory(pod)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	a, err := agent.New(agent.Config{
		Attacher:      r.loader,
		Source:        src,
		SelfCgroup:    r.selfCg,
		Mark:          r.loader.Mark(),
		Witness:       r.loader.Witness(),
		Policy:        pol,
		Proxy:         proxy.Config{Shared: shared},
		ShutdownGrace: 2 * time.Second,
		CleanupOnExit: true,
		Logger:        r.log,
	})
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stopAgent = func() {
		cancel()
		<-r.agentDone
	}
	r.agentDone = make(chan struct{})
	go func() {
		defer close(r.agentDone)
		if err := a.Run(ctx); err != nil {
			r.log.Error("agent", "err", err)
		}
	}()
	return waitRunning(a, "run", 10*time.Second)
}

// waitRunning waits for pod to run (or fail), on the agent's word that its
// pods changed.
func waitRunning(a *agent.Agent, pod string, limit time.Duration) error {
	ready := time.NewTimer(limit)
	defer ready.Stop()
	for {
		changed := a.PodsChanged()
		st, err := a.Pod(pod)
		if err == nil && st.State == agent.StateRunning {
			return nil
		}
		if err == nil && st.State == agent.StateFailed {
			return cli.Exit("egret could not put the command behind it: "+st.Error, 1)
		}
		select {
		case <-changed:
		case <-ready.C:
			return cli.Exit(fmt.Sprintf("egret did not become ready in %s", limit), 1)
		}
	}
}

// startCommand starts the command in its cgroup and namespace, with the
// run's stdio (and $EGRET_HOST under --netns new).
func (r *runEnv) startCommand(args []string) (*exec.Cmd, error) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if r.hostAddr.IsValid() {
		cmd.Env = append(os.Environ(), "EGRET_HOST="+r.hostAddr.String())
	}
	cgf, err := os.Open(r.cmdCg)
	if err != nil {
		return nil, cli.Exit(err.Error(), 1)
	}
	defer cgf.Close()
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgf.Fd())}
	// The child is forked on a thread inside the namespace and keeps it.
	if err := r.ns.Do(cmd.Start); err != nil {
		return nil, cli.Exit(err.Error(), 126)
	}
	return cmd, nil
}

// relaySignals passes SIGINT, SIGTERM and SIGHUP on to p until stop is
// called.
func relaySignals(p *os.Process) (stop func()) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		for s := range sigs {
			_ = p.Signal(s)
		}
	}()
	return func() { signal.Stop(sigs) }
}

// exitCode is the status egret run exits with for the command's end, as
// a shell gives it: its exit code, or 128 + the signal that killed it.
func exitCode(werr error) (int, error) {
	if werr == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if !errors.As(werr, &ee) {
		return 0, cli.Exit(werr.Error(), 1)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ee.ExitCode(), nil
}

// runEnv is what `egret run` sets up and must take down.
type runEnv struct {
	name      string
	log       *slog.Logger
	top       string // cgroup holding selfCg and cmdCg
	selfCg    string
	cmdCg     string
	origCg    string
	ns        *netns.NS
	nsPath    string // "" for host
	newNs     bool
	hostIf    string     // the host end of --netns new's veth
	hostAddr  netip.Addr // its address
	loader    *bpfload.Loader
	stopAgent func()
	agentDone chan struct{}
	done      bool
	lock      *os.File // the run's lock file, held while it lives
}

func (r *runEnv) setup(mode string) error {
	var err error
	if r.origCg, err = agent.CurrentCgroup(); err != nil {
		return err
	}
	r.top = filepath.Join(cgroup2.Root(), r.name)
	r.selfCg = filepath.Join(r.top, "egret")
	r.cmdCg = filepath.Join(r.top, "cmd")
	if err := os.MkdirAll(r.cmdCg, 0o755); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	if err := agent.EnterCgroup(r.selfCg); err != nil {
		return err
	}
	if mode == "new" {
		r.ns, err = netns.NewNamed(r.name)
		if err != nil {
			return err
		}
		r.newNs = true
		r.nsPath = r.ns.Path()
		var b [2]byte
		_, _ = rand.Read(b[:])
		base := netip.AddrFrom4([4]byte{10, 254, b[0], b[1] &^ 3})
		r.hostAddr = base.Next()
		r.hostIf = "egr" + r.name[len(r.name)-8:]
		if err := netns.Veth(r.ns, r.hostIf, netip.PrefixFrom(r.hostAddr, 30), netip.PrefixFrom(r.hostAddr.Next(), 30)); err != nil {
			return err
		}
		r.log.Info("command namespace", "netns", r.nsPath, "host", r.hostAddr, "command", r.hostAddr.Next())
	} else {
		r.ns = netns.Host()
	}
	return nil
}

func (r *runEnv) cleanup() {
	if r.done {
		return
	}
	r.done = true
	if r.stopAgent != nil {
		r.stopAgent()
	}
	if r.loader != nil {
		if err := r.loader.Remove(); err != nil {
			r.log.Error("remove eBPF state", "err", err)
		}
		r.loader.Close()
	}
	if r.ns != nil {
		r.ns.Close()
	}
	if r.hostIf != "" {
		if err := netns.DeleteLink(r.hostIf); err != nil {
			r.log.Error("remove veth", "err", err)
		}
	}
	if r.newNs {
		if err := netns.DeleteNamed(r.name); err != nil {
			r.log.Error("remove namespace", "err", err)
		}
	}
	if r.origCg != "" {
		if err := agent.EnterCgroup(r.origCg); err != nil {
			r.log.Error("leave cgroup", "err", err)
		}
	}
	if r.top != "" {
		// Whatever CMD left running in its cgroup goes with it.
		_ = os.WriteFile(filepath.Join(r.cmdCg, "cgroup.kill"), []byte("1"), 0)
		// Each waits for its last process's exit (an event: cgroup.events),
		// children before parents.
		for _, d := range []string{r.cmdCg, r.selfCg, r.top} {
			if err := cgroup2.Remove(d, time.Second); err != nil {
				r.log.Error("remove cgroup", "dir", d, "err", err)
			}
		}
	}
	if r.lock != nil {
		// Last: until everything is removed, the run counts as alive.
		os.Remove(runLockPath(r.name))
		r.lock.Close()
	}
}

// levelHandler drops records below a level.
type levelHandler struct {
	min slog.Level
	slog.Handler
}

func (h levelHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h levelHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return levelHandler{h.min, h.Handler.WithAttrs(as)}
}

func (h levelHandler) WithGroup(name string) slog.Handler {
	return levelHandler{h.min, h.Handler.WithGroup(name)}
}

const runPrefix = "egret-run-"

// runLockDir holds a lock file per `egret run`, NAME.lock, which the run's
// process holds locked (flock) for its whole life: the kernel releases the
// lock when the process is gone, however it ended, so a lock that can be
// taken is a run whose process is gone.
var runLockDir = "/run/egret/runs"

// lockRun creates and locks the lock file of run name. The file is locked
// before it gets its name, so a collector never finds it unlocked.
func lockRun(name string) (*os.File, error) {
	if err := os.MkdirAll(runLockDir, 0o755); err != nil {
		return nil, fmt.Errorf("run lock: %w", err)
	}
	f, err := os.CreateTemp(runLockDir, "."+name+"-*")
	if err != nil {
		return nil, fmt.Errorf("run lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("run lock: %w", err)
	}
	if err := os.Rename(f.Name(), runLockPath(name)); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("run lock: %w", err)
	}
	return f, nil
}

func runLockPath(name string) string { return filepath.Join(runLockDir, name+".lock") }

// claimRun takes the lock of run name if its process is gone. It returns
// the locked file (nil when the run has no lock file: one started by an
// egret before lock files) and whether the run is alive.
func claimRun(name string) (lock *os.File, alive bool) {
	f, err := os.Open(runLockPath(name))
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, true // held: its process lives
	}
	return f, false
}

// collectStaleRuns removes what an `egret run` killed without cleaning up
// (SIGKILL) left: its pinned eBPF state (whose pinned links would keep its
// command's cgroup attached), its namespace and veth, its cgroups and
// whatever still runs in them. It touches only runs whose process is gone:
// their lock file (runLockDir) is not held any more. A run without a lock
// file (an older egret's) is stale when no process is left in its egret
// cgroup, the egret run process's own, and it is not a run just starting.
// only, when not nil, limits the collection to the runs it accepts.
func collectStaleRuns(log *slog.Logger, only func(name string) bool) {
	names := map[string]bool{}
	for _, d := range []string{cgroup2.Root(), bpfload.BPFFSRoot, netns.Dir, runLockDir} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if name := strings.TrimSuffix(e.Name(), ".lock"); strings.HasPrefix(name, runPrefix) && (only == nil || only(name)) {
				names[name] = true
			}
		}
	}
	for name := range names {
		collectStaleRun(log, name)
	}
}

func collectStaleRun(log *slog.Logger, name string) {
	top := filepath.Join(cgroup2.Root(), name)
	lock, alive := claimRun(name)
	if alive {
		return
	}
	if lock != nil {
		defer func() {
			os.Remove(runLockPath(name))
			lock.Close()
		}()
	} else {
		if fi, err := os.Stat(top); err == nil && time.Since(fi.ModTime()) < 30*time.Second {
			return // maybe a run that is just starting
		}
		if procs, err := os.ReadFile(filepath.Join(top, "egret", "cgroup.procs")); err == nil && len(strings.TrimSpace(string(procs))) > 0 {
			return // alive
		}
		if _, err := os.Stat(filepath.Join(top, "egret")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return
		}
	}
	r := &runEnv{name: name, log: log, top: top, selfCg: filepath.Join(top, "egret"), cmdCg: filepath.Join(top, "cmd")}
	if _, err := os.Stat(top); err != nil {
		r.top = ""
	}
	pin := filepath.Join(bpfload.BPFFSRoot, name)
	if _, err := os.Stat(pin); err == nil {
		if l, err := bpfload.Load(bpfload.Options{PinDir: pin}); err == nil {
			r.loader = l
		} else {
			log.Warn("stale egret run: cannot adopt its eBPF state", "pin_dir", pin, "err", err)
		}
	}
	if _, err := os.Stat(filepath.Join(netns.Dir, name)); err == nil {
		r.newNs = true
	}
	r.hostIf = "egr" + name[len(name)-8:]
	r.cleanup()
	log.Info("removed what an earlier egret run left", "name", name)
}

// findCommand checks that name can be run, and when not, says why with
// the shell's status: 127 when it is not found, 126 when it is found but
// cannot be executed (a directory, a file without execute permission).
func findCommand(name string) error {
	_, err := exec.LookPath(name)
	if err == nil {
		return nil
	}
	path := name
	if !strings.Contains(name, "/") {
		// Searched in PATH: found there but not executable is still
		// found (bash says "Permission denied", 126).
		path = ""
		for dir := range strings.SplitSeq(os.Getenv("PATH"), ":") {
			if dir == "" {
				dir = "."
			}
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				path = filepath.Join(dir, name)
				break
			}
		}
	}
	if path == "" {
		return cli.Exit(fmt.Sprintf("%s: command not found (not in PATH)", name), 127)
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return cli.Exit(fmt.Sprintf("%s: command not found (%v)", name, errors.Unwrap(err)), 127)
	case fi.IsDir():
		return cli.Exit(fmt.Sprintf("%s: is a directory, not a command", path), 126)
	default:
		return cli.Exit(fmt.Sprintf("%s: found but not executable (permission denied)", path), 126)
	}
}
