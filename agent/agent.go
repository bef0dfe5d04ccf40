// Package agent is egret's node agent: it keeps every pod a pods.Source
// names behind a transparent egret proxy.
//
// For each pod the agent opens the pod's listeners (127.0.0.1:PORT and
// [::1]:PORT) inside the pod's network namespace, runs a transparent
// proxy.Server on them whose original destinations come from egret's
// cgroup/getsockopt program and whose upstream connections are dialed from
// the pod's namespace (so the pod's source address and network policy
// apply: egret never reaches what the pod could not), and then attaches
// egret's connect4/connect6/sockops programs to the pod's cgroup. Budgets,
// bulkheads and metrics are one per node, shared by all pods' proxies;
// each pod keeps the traces of its own recent requests (so a busy pod
// cannot push a quiet one's out), and Trace looks in all of them. A pod that goes is detached and its listeners closed.
//
// Fail-open: the connect programs redirect only while an agent serves
// (bpfload's egret_alive, set once the pod source's initial pods run) and the pod's listener exists (they look
// it up per connect), so when the agent dies the pod's connects go direct.
// Pinned links and maps outlive the agent; a new agent adopts them
// (bpfload.Load) and reopens the listeners, and redirection resumes. With
// a keeper (Config.Keeper, `egret keeper`) the listeners outlive the agent
// too: connects queued on them when it died stay queued, and the next agent
// adopts the listeners (Config.Kept) and serves them.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/promreg"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/retry"
	"github.com/egret-proxy/egret/witness"
)

// DefaultListenPort is the port of a pod's egret listeners when neither the
// pod nor the Config names one.
const DefaultListenPort = 15001

// DefaultTracesPerPod is Config.TracesPerPod's default.
const DefaultTracesPerPod = 1024

// Attacher is what the agent needs from the eBPF loader. *bpfload.Loader
// implements it; Fake is an in-memory one for tests without root.
type Attacher interface {
	AttachPod(cgroupPath string, cfg bpfload.PodConfig) (uint64, error)
	DetachPodID(id uint64) error
	// DetachPodDrained detaches the pod but keeps what its proxy needs to
	// serve the connections redirected before (their original
	// destinations) until forget is called.
	DetachPodDrained(id uint64) (forget func() error, err error)
	Pods() ([]uint64, error)
	AttachSelf(cgroupPath string) error
	DetachSelf(cgroupPath string) error
	// LearnDirect makes the pod's connects to dst go direct for ttl
	// (bpfload.ErrLearningOff when the pod has learning off).
	LearnDirect(podID uint64, dst netip.AddrPort, proto bpfload.DirectProtocol, ttl time.Duration) error
	// LearnedDirect lists the pod's learned destinations; ForgetDirect
	// removes one (its next connect is redirected and sniffed again).
	LearnedDirect(podID uint64) ([]bpfload.Learned, error)
	ForgetDirect(podID uint64, dst netip.AddrPort) error
	// NodeDirectStats sums the kernel's counters of every pod's
	// learned-direct connections; LearnedEntries counts the learned
	// destinations held.
	NodeDirectStats() (bpfload.DirectStats, error)
	LearnedEntries() (int, error)
	// NodeFlows reads the kernel's counters of the pods' connects left
	// direct (policy, learned, fail-open), by pod and path.
	NodeFlows() ([]bpfload.PodFlow, error)
	// OriginalDstOf looks an accepted connection's original destination
	// up in the kernel's map, for connections accepted on a listener the
	// agent adopted (made in an earlier agent's cgroup, where
	// SO_ORIGINAL_DST is not answered); bpfload.ErrNoOriginalDst if it is
	// not there.
	OriginalDstOf(c syscall.RawConn) (netip.AddrPort, error)
	// SetAlive tells the kernel an agent serves: until it is called, and
	// once the agent's process is gone, pods' connects go direct.
	SetAlive() error
}

var _ Attacher = (*bpfload.Loader)(nil)

// Config configures an Agent.
type Config struct {
	// Attacher attaches pods (required): a *bpfload.Loader on a node.
	Attacher Attacher
	// Source names the pods (required).
	Source pods.Source
	// Endpoints, when set, reports the Kubernetes Service endpoints that
	// left their Service (agent/services.Table, also Proxy.Services): the
	// agent closes every pod's pooled connections to them.
	Endpoints GoneEndpoints
	// SelfCgroup is the agent's own cgroup v2 directory, where egret's
	// getsockopt (SO_ORIGINAL_DST answers) and witness programs go. The
	// listeners and upstream sockets the agent creates belong to it. Empty:
	// not attached (tests with a Fake).
	SelfCgroup string
	// Mark is the SO_MARK of upstream sockets (bpfload.Loader.Mark()).
	Mark uint32
	// Witness observes upstream sockets (the loader's eBPF witness); the
	// TCP_INFO witness is the fallback for sockets it does not track.
	Witness witness.Witness
	// ListenPort of pods that name none (DefaultListenPort if 0).
	ListenPort uint16
	// Policy is the node's policy (embedded defaults if nil); a pod's own
	// override is laid over it.
	Policy proxy.PolicySource
	// Proxy gives what every pod's proxy is made of alike: its Shared
	// parts (those not given are made by New, with proxy.NewShared, one
	// for the node; Witness and FDs are the fields above), Timeouts and
	// Bounds, each given whole to every pod's proxy.Config. The rest of a
	// pod's proxy.Config is its own, set by the agent; Proxy.Policy is the
	// node's when Policy is nil.
	Proxy proxy.Config
	// ShutdownGrace is how long in-flight requests of a pod that goes (or
	// of every pod when Run ends) may take (default 5 s).
	ShutdownGrace time.Duration
	// CleanupOnExit detaches every pod and egret's own cgroup when Run
	// ends. Off on a node: the pinned state stays so that a restarted
	// agent adopts it (and pods fail open meanwhile).
	CleanupOnExit bool
	// Settle is how long a stopping pod's listeners keep accepting after
	// the kernel stopped redirecting to them, so that connects redirected
	// just before are served rather than reset (default 50 ms). It is a
	// pause, not a poll, because no event marks its end: detaching a
	// cgroup program does not wait for connects that already ran it, and
	// such a connect's SYN reaches the listener later (on another CPU's
	// softirq, on a busy machine); nothing tells user space that every one
	// has. Once it has arrived, the stop waits on accepts, not on a clock.
	Settle time.Duration
	// RetryInterval: how long a pod that failed to start waits before it
	// is tried again (default 2 s), doubled with each failure in a row up
	// to a minute. Only the first failure in a row is logged as an error.
	RetryInterval time.Duration
	// TracesPerPod is how many recent requests' traces each pod keeps for
	// explain (DefaultTracesPerPod if 0).
	TracesPerPod int
	// PodLimits are the limits of a pod that sets none of its own (zero
	// fields: proxy's defaults; Conns: FDs.FairShare, a quarter of the
	// connections the descriptors allow, at most proxy.DefaultConnLimit).
	PodLimits proxy.Limits
	// FDs is the account of the descriptors pods may take (nil: one of the
	// process's soft RLIMIT_NOFILE now, less FDReserve). When it runs out,
	// every pod's listeners are cleared from its kernel config, so that
	// new connects go direct rather than wait in an accept queue egret
	// cannot serve, until it has room again.
	FDs *proxy.FDs
	// FDReserve is the descriptors kept out of pods' reach for egret
	// itself (0: proxy.DefaultFDReserve or an eighth of the limit).
	FDReserve int
	// WrapDial, if set, wraps each pod's upstream dialer (tests).
	WrapDial func(pod string, d proxy.DialFunc) proxy.DialFunc
	// Reporter, if set, is told of each request a pod's proxy answered
	// ambiguous (the Kubernetes source records a Warning Event on the
	// pod).
	Reporter Reporter
	// Keeper, if set, is handed a duplicate of each pod's listener (see
	// package keeper), so that connects queued on it outlive the agent.
	Keeper ListenerKeeper
	// Kept are the listeners the keeper held for an earlier agent, by
	// ListenerName: the pod they belong to adopts them (and serves the
	// connects queued on them); those no pod adopts are closed once the
	// pod source has listed its pods. The agent owns them.
	Kept map[string]*os.File

	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Reporter is told what a pod's owner should hear of. Its methods must
// not block for long: a pod's reports are delivered in order from one
// goroutine, and those that find it behind are dropped.
type Reporter interface {
	// Ambiguous: egret could not tell whether request r of pod ran
	// upstream (and so did not retry it).
	Ambiguous(pod string, r pods.AmbiguousRequest)
}

// Pod states.
const (
	StateRunning = "running"
	StateFailed  = "failed"
)

// Agent reconciles pods with egret's proxies. Create with New, then Run.
type Agent struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	// shared are the parts every pod's proxy shares (Config.Proxy's, made
	// by proxy.NewShared).
	shared proxy.Shared

	drains sync.WaitGroup // pods draining in the background

	mu      sync.Mutex
	pods    map[string]*podState
	synced  bool
	running bool
	selfOK  bool // egret's own cgroup attached (or none to attach)
	stopped bool // Run has left its loop
	started time.Time
	// direct: out of descriptors, every pod's new connects go direct.
	direct bool
	// podsChanged is closed (and replaced) at each change of pods.
	podsChanged chan struct{}
	// policyApplied is closed (and replaced) when a policy reload has
	// been applied to the running pods.
	policyApplied chan struct{}
	// tlsOrigins is the TLS origination of the node policy last applied
	// (tlsOrigins); Run's goroutine only.
	tlsOrigins string
}

// Ready says whether the agent serves its node: nil once Run has attached
// egret's own cgroup and acted on the pod source's initial list (Synced),
// until Run ends; otherwise an error wrapping ErrNotReady that says what
// is missing. A pod that failed to start does not make the agent unready:
// it is reported (and retried) on its own.
func (a *Agent) Ready() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case !a.running:
		return fmt.Errorf("%w: not running", ErrNotReady)
	case a.stopped:
		return fmt.Errorf("%w: stopping", ErrNotReady)
	case !a.selfOK:
		return fmt.Errorf("%w: egret's own cgroup not attached yet", ErrNotReady)
	case !a.synced:
		return fmt.Errorf("%w: the pod source has not listed its pods yet", ErrNotReady)
	}
	return nil
}

// Sentinel errors.
var (
	// ErrConfig: an unusable Config.
	ErrConfig = errors.New("agent: invalid config")
	// ErrNoPod: no pod of that name.
	ErrNoPod = errors.New("agent: no such pod")
	// ErrNotReady: the agent does not serve its node yet, or any more
	// (Ready says why).
	ErrNotReady = errors.New("agent: not ready")
	// ErrPodCgroup: a pod's cgroup cannot be used: another pod's, or one
	// holding egret's own.
	ErrPodCgroup = errors.New("agent: unusable pod cgroup")
)

// New checks cfg and returns an Agent.
func New(cfg Config) (*Agent, error) {
	if cfg.Attacher == nil || cfg.Source == nil {
		return nil, fmt.Errorf("%w: Attacher and Source are required", ErrConfig)
	}
	if cfg.ListenPort == 0 {
		cfg.ListenPort = DefaultListenPort
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 5 * time.Second
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 50 * time.Millisecond
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Policy == nil {
		cfg.Policy = cfg.Proxy.Policy
	}
	if cfg.Witness == nil {
		cfg.Witness = witness.TCPInfo{}
	} else {
		cfg.Witness = fallbackWitness{primary: cfg.Witness, fallback: witness.TCPInfo{}}
	}
	if cfg.FDs == nil {
		var rl syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			return nil, fmt.Errorf("%w: RLIMIT_NOFILE: %v", ErrConfig, err)
		}
		cfg.FDs = proxy.NewFDs(int(min(rl.Cur, 1<<30)), cfg.FDReserve)
	}
	m, err := newMetrics(cfg.Registerer, cfg.Attacher, cfg.FDs)
	if err != nil {
		return nil, err
	}
	// One set of shared parts for the node: every pod's proxy gets them.
	cfg.Proxy.Witness, cfg.Proxy.FDs = cfg.Witness, cfg.FDs
	if cfg.Proxy.Shared, err = proxy.NewShared(cfg.Registerer, cfg.Proxy.Shared); err != nil {
		return nil, err
	}
	if cfg.TracesPerPod <= 0 {
		cfg.TracesPerPod = DefaultTracesPerPod
	}
	a := &Agent{
		cfg:           cfg,
		log:           cfg.Logger,
		m:             m,
		shared:        cfg.Proxy.Shared,
		pods:          map[string]*podState{},
		podsChanged:   make(chan struct{}),
		policyApplied: make(chan struct{}),
	}
	if err := promreg.Register(cfg.Registerer, newFlowCollector(a)); err != nil {
		return nil, err
	}
	return a, nil
}

// Budgets returns the node-wide retry budgets shared by every pod.
func (a *Agent) Budgets() *engine.Budgets { return a.shared.Budgets }

// Trace returns the trace of a request by its Egret-Request-Id.
// The pod whose proxy answered the request is returned with it.
func (a *Agent) Trace(id string) (retry.Trace, string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, ps := range a.pods {
		if ps.traces == nil {
			continue
		}
		if tr, ok := ps.traces.Get(id); ok {
			return tr, name, true
		}
	}
	return retry.Trace{}, "", false
}

// Run starts the agent and reconciles until ctx ends or the source fails.
// When it returns every pod's listeners are closed (so pods fail open);
// with CleanupOnExit the pods are detached too.
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.running {
		a.mu.Unlock()
		return fmt.Errorf("%w: Run called twice", ErrConfig)
	}
	a.running = true
	a.started = time.Now()
	a.mu.Unlock()

	if a.cfg.SelfCgroup != "" {
		if err := a.cfg.Attacher.AttachSelf(a.cfg.SelfCgroup); err != nil {
			a.mu.Lock()
			a.stopped = true
			a.mu.Unlock()
			return fmt.Errorf("agent: attach egret's own cgroup %s: %w", a.cfg.SelfCgroup, err)
		}
	}
	a.mu.Lock()
	a.selfOK = true
	a.mu.Unlock()
	srcCtx, stopSrc := context.WithCancel(ctx)
	defer stopSrc()
	events := make(chan pods.Event)
	srcErr := make(chan error, 1)
	go func() { srcErr <- a.cfg.Source.Run(srcCtx, events) }()

	tick := time.NewTicker(a.cfg.RetryInterval)
	defer tick.Stop()
	var polChanged <-chan struct{} // nil: a policy that never changes
	reloads, _ := a.cfg.Policy.(PolicyReloads)
	if reloads != nil {
		polChanged = reloads.Changed()
		a.tlsOrigins = tlsOrigins(a.cfg.Policy.Current())
	}
	var gone <-chan struct{} // nil: no Services
	if a.cfg.Endpoints != nil {
		gone = a.cfg.Endpoints.Gone()
	}
	var err error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-gone:
			a.closeGone()
		case err = <-srcErr:
			if ctx.Err() != nil {
				err = nil
			} else {
				err = fmt.Errorf("agent: pod source: %w", err)
			}
			break loop
		case ev := <-events:
			if err = a.handle(ev); err != nil {
				break loop
			}
		case <-tick.C:
			a.retryFailed()
		case <-a.cfg.FDs.Changed():
			a.setDirect(a.cfg.FDs.Exhausted())
		case <-polChanged:
			polChanged = reloads.Changed()
			a.policyReloaded()
		}
	}
	a.mu.Lock()
	a.stopped = true
	a.mu.Unlock()
	stopSrc()
	a.stopAll()
	return err
}

// GoneEndpoints reports endpoints that left their Service: Gone is
// signalled, TakeGone gives their addresses (host:port) and how many were
// dropped past its bound.
type GoneEndpoints interface {
	Gone() <-chan struct{}
	TakeGone() (addrs []string, dropped uint64)
}

// closeGone closes the pods' pooled connections to endpoints that left
// their Service.
func (a *Agent) closeGone() {
	addrs, dropped := a.cfg.Endpoints.TakeGone()
	if dropped > 0 {
		a.log.Warn("endpoints left faster than their connections could be closed; the rest close when idle", "dropped", dropped)
	}
	a.mu.Lock()
	srvs := make([]*proxy.Server, 0, len(a.pods))
	for _, ps := range a.pods {
		if ps.srv != nil {
			srvs = append(srvs, ps.srv)
		}
	}
	a.mu.Unlock()
	for _, s := range srvs {
		s.CloseEndpoints(addrs)
	}
}

// PolicyReloads is a node policy source that reloads (*policy.Watcher):
// after each reload the agent rewrites the kernel config of every running
// pod whose direct: settings it changed.
type PolicyReloads interface {
	// Changed is closed when a reload puts a new policy in force.
	Changed() <-chan struct{}
}

// policyReloaded rewrites the kernel config (direct ports, CIDRs, default
// ports, learning) and learn TTL of each running pod whose node direct:
// section changed.
func (a *Agent) policyReloaded() {
	a.mu.Lock()
	running := make([]*podState, 0, len(a.pods))
	for _, ps := range a.pods {
		if ps.state == StateRunning && ps.cgid != 0 {
			running = append(running, ps)
		}
	}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		close(a.policyApplied)
		a.policyApplied = make(chan struct{})
		a.mu.Unlock()
	}()
	// A destination the policy originates TLS for is never learned
	// direct (the pod's plain HTTP to it must reach egret). When the
	// entries that originate TLS change, what the pods learned under the
	// old ones is forgotten: each destination is sniffed, and learned or
	// not, again at its next connect.
	if sig := tlsOrigins(a.cfg.Policy.Current()); sig != a.tlsOrigins {
		a.tlsOrigins = sig
		for _, ps := range running {
			n, err := a.forgetLearned(ps.cgid)
			if err != nil {
				a.m.failures.WithLabelValues("update").Inc()
				a.log.Error("forget learned destinations after a TLS origination change", "pod", ps.pod.Name, "err", err)
			} else if n > 0 {
				a.log.Info("learned destinations forgotten: the policy's TLS origination changed", "pod", ps.pod.Name, "destinations", n)
			}
		}
	}
	for _, ps := range running {
		d := ps.direct()
		if d.Equal(ps.applied) {
			continue
		}
		if _, err := a.cfg.Attacher.AttachPod(ps.pod.Cgroup, a.kernelConfig(ps, ps.pod)); err != nil {
			a.m.failures.WithLabelValues("update").Inc()
			a.log.Error("pod kernel config after a policy reload", "pod", ps.pod.Name, "err", err)
			continue
		}
		ps.applied = d
		ps.learner.ttl.Store(int64(ps.learnTTL(ps.pod)))
		a.log.Info("pod direct config rewritten after a policy reload", "pod", ps.pod.Name,
			"direct_ports", d.Ports, "direct_cidrs", d.CIDRs, "default_ports", d.DefaultPorts, "learn", d.Learn)
	}
}

// forgetLearned forgets every destination the pod learned direct.
func (a *Agent) forgetLearned(id uint64) (int, error) {
	learned, err := a.cfg.Attacher.LearnedDirect(id)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, l := range learned {
		errs = append(errs, a.cfg.Attacher.ForgetDirect(id, l.Dst))
	}
	return len(learned), errors.Join(errs...)
}

// tlsOrigins names what of the policy originates TLS: the defaults' switch
// and each entry with TLS on, by host and port.
func tlsOrigins(p *policy.Policy) string {
	if p == nil {
		return ""
	}
	var b strings.Builder
	if p.Defaults != nil && p.Defaults.TLS.Enabled {
		b.WriteString("defaults;")
	}
	for _, u := range p.Upstreams {
		if u.TLS.Enabled {
			fmt.Fprintf(&b, "%s:%d;", u.Host, u.Port)
		}
	}
	return b.String()
}

// PolicyApplied returns a channel closed once the agent has applied the
// next reload of its node policy (a PolicyReloads) to the running pods.
// Take it before the reload.
func (a *Agent) PolicyApplied() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.policyApplied
}

// setDirect sends every pod's new connects direct (out of descriptors:
// egret could not accept them) or to egret again. The listeners stay open:
// what was queued before is served.
func (a *Agent) setDirect(direct bool) {
	a.mu.Lock()
	if a.direct == direct {
		a.mu.Unlock()
		return
	}
	a.direct = direct
	running := make([]*podState, 0, len(a.pods))
	for _, ps := range a.pods {
		if ps.state == StateRunning && ps.cgid != 0 {
			running = append(running, ps)
		}
	}
	a.mu.Unlock()
	if direct {
		a.m.failOpen.Set(1)
		a.log.Warn("out of file descriptors for pods: their new connects go direct until egret has room",
			"used", a.cfg.FDs.Used(), "capacity", a.cfg.FDs.Capacity(), "pods", len(running))
	} else {
		a.m.failOpen.Set(0)
		a.log.Info("file descriptors back: pods' connects come to egret again",
			"used", a.cfg.FDs.Used(), "capacity", a.cfg.FDs.Capacity(), "pods", len(running))
	}
	for _, ps := range running {
		if _, err := a.cfg.Attacher.AttachPod(ps.pod.Cgroup, a.kernelConfig(ps, ps.pod)); err != nil {
			a.m.failures.WithLabelValues("update").Inc()
			a.log.Error("pod kernel config", "pod", ps.pod.Name, "direct", direct, "err", err)
		}
	}
}

// kernelConfig is the pod's kernel config: its listeners, unless every
// pod goes direct for now.
func (a *Agent) kernelConfig(ps *podState, p pods.Pod) bpfload.PodConfig {
	cfg := ps.kernelConfig(p)
	a.mu.Lock()
	direct := a.direct
	a.mu.Unlock()
	if direct {
		cfg.Listen4, cfg.Listen6 = netip.AddrPort{}, netip.AddrPort{}
	}
	return cfg
}

// podLimits are the limits p gets: its own, else the agent's.
func (a *Agent) podLimits(p pods.Pod) proxy.Limits {
	l := a.cfg.PodLimits
	if l.Conns <= 0 {
		l.Conns = a.cfg.FDs.FairShare()
	}
	if p.Limits.Conns > 0 {
		l.Conns = p.Limits.Conns
	}
	if p.Limits.InFlight > 0 {
		l.InFlight = p.Limits.InFlight
	}
	if p.Limits.SpoolBytes > 0 {
		l.SpoolBytes = p.Limits.SpoolBytes
	}
	return l.WithDefaults()
}

// handle acts on one event of the pod source. Its error ends Run: the
// agent could not tell the kernel that it serves.
func (a *Agent) handle(ev pods.Event) error {
	a.m.events.WithLabelValues(ev.Kind.String()).Inc()
	switch ev.Kind {
	case pods.Added, pods.Updated:
		a.put(ev.Pod)
	case pods.Removed:
		a.remove(ev.Pod.Name)
	case pods.Synced:
		// The initial pods run (their listeners open, or adopted with the
		// connects queued on them): from now on connects come to egret.
		if err := a.cfg.Attacher.SetAlive(); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		a.collect()
		a.dropUnadopted()
	}
	a.updateGauges()
	return nil
}

func (a *Agent) put(p pods.Pod) {
	a.mu.Lock()
	ps := a.pods[p.Name]
	a.mu.Unlock()
	if ps != nil && ps.state == StateRunning && ps.pod.Cgroup == p.Cgroup &&
		ps.pod.Netns == p.Netns && ps.pod.ListenPort == p.ListenPort {
		// Same place: update the kernel config and the policy in place.
		if err := ps.update(a, p); err != nil {
			a.log.Error("pod update failed", "pod", p.Name, "err", err)
			a.m.failures.WithLabelValues("update").Inc()
		} else {
			a.log.Info("pod updated", "pod", p.Name)
		}
		return
	}
	if ps != nil {
		a.stopPod(ps, true)
	}
	a.startPod(p)
}

func (a *Agent) startPod(p pods.Pod) {
	a.startPodAfter(p, 0)
}

// startPodAfter starts p; fails is how many starts of it failed in a row
// before (they space the retries and quiet the log).
func (a *Agent) startPodAfter(p pods.Pod, fails int) {
	start := time.Now()
	ps, err := a.newPod(p)
	if err != nil {
		a.m.failures.WithLabelValues("start").Inc()
		level := slog.LevelError
		if fails > 0 {
			level = slog.LevelDebug // said already; the status keeps the error
		}
		a.log.Log(context.Background(), level, "pod start failed", "pod", p.Name, "err", err, "failures", fails+1)
		ps = &podState{pod: p, state: StateFailed, err: err, since: time.Now(), fails: fails + 1}
	} else {
		a.m.startTime.Observe(time.Since(start).Seconds())
		a.log.Info("pod running", "pod", p.Name, "cgroup", p.Cgroup, "netns", ps.ns.Path(),
			"listen", ps.listenStrings(), "cgroup_id", ps.cgid, "took", time.Since(start).Round(time.Microsecond))
	}
	a.mu.Lock()
	a.pods[p.Name] = ps
	a.podsChangedLocked()
	a.mu.Unlock()
}

// podsChangedLocked tells PodsChanged's callers that pods changed.
func (a *Agent) podsChangedLocked() {
	close(a.podsChanged)
	a.podsChanged = make(chan struct{})
}

// PodsChanged returns a channel closed at the next change of the pods: a
// pod started, failed to start, or went. Take it before reading a pod's
// status (Pod, Pods), and no change after the read is missed.
func (a *Agent) PodsChanged() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.podsChanged
}

func (a *Agent) remove(name string) {
	a.mu.Lock()
	ps := a.pods[name]
	a.mu.Unlock()
	if ps != nil {
		// Once its last request is answered, the pod's series go.
		a.stopPodThen(ps, true, func() { a.shared.Metrics.Forget(sourceOf(ps.pod)) })
		a.log.Info("pod removed", "pod", name)
	}
	a.mu.Lock()
	if a.pods[name] == ps {
		delete(a.pods, name)
		a.podsChangedLocked()
	}
	a.mu.Unlock()
}

// stopPod detaches the pod and closes its listeners now; its in-flight
// requests drain in the background (stopAll waits for them), so a slow
// pod never holds up the events of the others.
func (a *Agent) stopPod(ps *podState, detach bool) { a.stopPodThen(ps, detach, nil) }

// stopPodThen is stopPod, and calls then (if not nil) once the pod has
// drained.
func (a *Agent) stopPodThen(ps *podState, detach bool, then func()) {
	drain, err := ps.stop(a, detach)
	if err != nil {
		a.m.failures.WithLabelValues("stop").Inc()
		a.log.Error("pod stop", "pod", ps.pod.Name, "err", err)
	}
	a.drains.Add(1)
	go func() {
		defer a.drains.Done()
		if err := drain(); err != nil {
			a.log.Warn("pod drained with requests cut short", "pod", ps.pod.Name, "err", err)
		}
		if then != nil {
			then()
		}
	}()
}

// retryFailed starts again the failed pods whose wait is over: the
// RetryInterval, doubled with each failure in a row, up to a minute.
func (a *Agent) retryFailed() {
	type retry struct {
		p     pods.Pod
		fails int
	}
	a.mu.Lock()
	var due []retry
	for _, ps := range a.pods {
		if ps.state != StateFailed {
			continue
		}
		wait := a.cfg.RetryInterval << min(ps.fails-1, 10)
		if time.Since(ps.since) >= min(wait, time.Minute) {
			due = append(due, retry{ps.pod, ps.fails})
		}
	}
	a.mu.Unlock()
	for _, r := range due {
		a.startPodAfter(r.p, r.fails)
	}
	if len(due) > 0 {
		a.updateGauges()
	}
}

// collect detaches pods pinned by an earlier agent that the source no
// longer names (their listeners are gone, so they were failing open).
func (a *Agent) collect() {
	ids, err := a.cfg.Attacher.Pods()
	if err != nil {
		a.log.Error("list pinned pods", "err", err)
		return
	}
	a.mu.Lock()
	a.synced = true
	known := map[uint64]bool{}
	for _, ps := range a.pods {
		if ps.cgid != 0 {
			known[ps.cgid] = true
		}
	}
	a.mu.Unlock()
	for _, id := range ids {
		if known[id] {
			continue
		}
		if err := a.cfg.Attacher.DetachPodID(id); err != nil {
			a.log.Error("detach stale pod", "cgroup_id", id, "err", err)
			continue
		}
		a.m.collected.Inc()
		a.log.Info("stale pod detached", "cgroup_id", id)
	}
}

// SetCleanupOnExit changes Config.CleanupOnExit before Run ends: the
// caller decides at stop time whether the pinned state goes (an
// uninstall) or stays for the next agent (a restart). Call it before
// cancelling Run's context.
func (a *Agent) SetCleanupOnExit(cleanup bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cfg.CleanupOnExit = cleanup
}

func (a *Agent) stopAll() {
	a.mu.Lock()
	cleanup := a.cfg.CleanupOnExit
	all := make([]*podState, 0, len(a.pods))
	for _, ps := range a.pods {
		all = append(all, ps)
	}
	a.pods = map[string]*podState{}
	a.podsChangedLocked()
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, ps := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.stopPod(ps, cleanup)
		}()
	}
	wg.Wait()
	a.drains.Wait()
	if cleanup && a.cfg.SelfCgroup != "" {
		if err := a.cfg.Attacher.DetachSelf(a.cfg.SelfCgroup); err != nil {
			a.log.Error("detach egret's own cgroup", "err", err)
		}
	}
	a.updateGauges()
}

func (a *Agent) updateGauges() {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := map[string]int{StateRunning: 0, StateFailed: 0}
	for _, ps := range a.pods {
		n[ps.state]++
	}
	for s, v := range n {
		a.m.pods.WithLabelValues(s).Set(float64(v))
	}
}

// PodStatus is what the agent knows of one pod (the admin API's answer).
type PodStatus struct {
	Name     string    `json:"name"`
	State    string    `json:"state"`
	Error    string    `json:"error,omitempty"`
	Failures int       `json:"failures,omitempty"` // failed starts in a row
	Cgroup   string    `json:"cgroup"`
	CgroupID uint64    `json:"cgroup_id,omitempty"`
	Netns    string    `json:"netns"`
	Listen   []string  `json:"listen,omitempty"`
	Since    time.Time `json:"since"`
	Policy   string    `json:"policy,omitempty"`
	// Limits are the pod's limits in force, Usage what it holds of them
	// now and how often it was refused.
	Limits *proxy.Limits `json:"limits,omitempty"`
	Usage  *proxy.Usage  `json:"usage,omitempty"`
}

// Pods returns the status of every pod, by name.
func (a *Agent) Pods() []PodStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]PodStatus, 0, len(a.pods))
	for _, ps := range a.pods {
		out = append(out, ps.status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Pod returns the status of one pod.
func (a *Agent) Pod(name string) (PodStatus, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ps, ok := a.pods[name]
	if !ok {
		return PodStatus{}, fmt.Errorf("%w: %s", ErrNoPod, name)
	}
	return ps.status(), nil
}

// Status is the agent's summary.
type Status struct {
	Started time.Time `json:"started"`
	Synced  bool      `json:"synced"`
	Pods    int       `json:"pods"`
	Running int       `json:"running"`
	Failed  int       `json:"failed"`
	Traces  int       `json:"traces"`
	// Direct sums the connections of the pods egret does not retry: the
	// connects the kernel saw them make direct and those egret passed
	// through (DirectSummaries); absent when the kernel's counters cannot
	// be read.
	Direct *DirectTotals `json:"direct,omitempty"`
}

// Status returns the agent's summary.
func (a *Agent) Status() Status {
	s := a.status()
	if rows, err := a.directRows(); err == nil {
		s.Direct = directTotals(rows)
	}
	return s
}

func (a *Agent) status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Status{Started: a.started, Synced: a.synced, Pods: len(a.pods)}
	for _, ps := range a.pods {
		if ps.traces != nil {
			s.Traces += ps.traces.Len()
		}
		if ps.state == StateRunning {
			s.Running++
		} else {
			s.Failed++
		}
	}
	return s
}

// UpstreamStatus is one upstream's node-wide retry budget.
type UpstreamStatus struct {
	Upstream string  `json:"upstream"`
	Tokens   float64 `json:"tokens"`
}

// Upstreams returns the node-wide budgets of the upstreams in use: those
// idle past their budget's TTL are forgotten.
func (a *Agent) Upstreams() []UpstreamStatus { return upstreamsOf(a.shared.Budgets) }

// upstreamsOf lists the budgets of b in use now, by upstream.
func upstreamsOf(b *engine.Budgets) []UpstreamStatus {
	out := []UpstreamStatus{}
	now := time.Now()
	b.Sweep(now)
	b.Each(func(u string, bud *engine.Budget) {
		out = append(out, UpstreamStatus{Upstream: u, Tokens: bud.Tokens(now)})
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Upstream < out[j].Upstream })
	return out
}

// FreeListenPort finds a TCP port free on both loopback addresses of the
// calling thread's network namespace (free now: another may take it before
// it is used), for a pod's listeners.
func FreeListenPort() (uint16, error) {
	for range 20 {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l6, err := net.Listen("tcp6", net.JoinHostPort("::1", strconv.Itoa(port)))
		l.Close()
		if err == nil {
			l6.Close()
			return uint16(port), nil
		}
	}
	return 0, errors.New("agent: no port free on both 127.0.0.1 and ::1")
}

func listenAddrs(port uint16) (netip.AddrPort, netip.AddrPort) {
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port),
		netip.AddrPortFrom(netip.IPv6Loopback(), port)
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort()
	}
	return netip.AddrPort{}
}
