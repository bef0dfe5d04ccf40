package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/netns"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/retry"
)

// podState is one pod's runtime: its namespace, listeners, proxy and
// attachment.
type podState struct {
	pod    pods.Pod
	state  string
	err    error
	fails  int // failed starts in a row (state failed)
	since  time.Time
	cgid   uint64
	ns     *netns.NS
	listen []netip.AddrPort
	srv    *proxy.Server
	policy *podPolicy
	lns    []*acceptListener // the pod's listeners, served by srv
	// kept are the keeper's names of the listeners ("" for none).
	kept   []string
	traces *proxy.Traces
	quota  *proxy.Quota
	served sync.WaitGroup
	// unwatch ends the delivery of the pod's ambiguous answers to the
	// Reporter.
	unwatch func() uint64
	// learner writes the destinations the pod's proxy learned direct;
	// its pod id is set once the pod is attached.
	learner *podLearner
	// applied is the node policy's direct: section last written into the
	// pod's kernel config.
	applied policy.Direct
}

// podLearner is the pod proxy's proxy.Learner: it writes the kernel's
// learned-direct map for this pod (Attacher.LearnDirect).
type podLearner struct {
	att Attacher
	id  atomic.Uint64
	ttl atomic.Int64 // time.Duration; 0: bpfload.DefaultLearnTTL
}

var _ proxy.Learner = (*podLearner)(nil)

// LearnDirect implements proxy.Learner. A pod with learning off (or not
// attached yet, or any more) learns nothing, and that is no error.
func (l *podLearner) LearnDirect(dst netip.AddrPort, proto proxy.Protocol) error {
	id := l.id.Load()
	if id == 0 {
		return nil
	}
	err := l.att.LearnDirect(id, dst, directProtocol(proto), time.Duration(l.ttl.Load()))
	if errors.Is(err, bpfload.ErrLearningOff) {
		return nil
	}
	return err
}

func directProtocol(p proxy.Protocol) bpfload.DirectProtocol {
	switch p {
	case proxy.ProtoTLS:
		return bpfload.DirectTLS
	case proxy.ProtoHTTP2:
		return bpfload.DirectHTTP2
	case proxy.ProtoSilent:
		return bpfload.DirectServerFirst
	}
	return bpfload.DirectOther
}

func (a *Agent) newPod(p pods.Pod) (_ *podState, err error) {
	if err := a.checkCgroup(p); err != nil {
		return nil, err
	}
	ps := &podState{pod: p, state: StateRunning, since: time.Now()}
	defer func() {
		if err != nil {
			if drain, _ := ps.stop(a, true); drain != nil {
				drain()
			}
		}
	}()
	if ps.ns, err = netns.Open(p.Netns); err != nil {
		return nil, err
	}
	if err := a.openListeners(ps, p); err != nil {
		return nil, err
	}
	ps.policy = newPodPolicy(a.cfg.Policy, p, a.log)
	ps.traces = proxy.NewTraces(a.cfg.TracesPerPod)
	a.reportAmbiguous(ps, p)
	ps.quota = proxy.NewQuota(a.podLimits(p), a.cfg.FDs)
	ps.learner = &podLearner{att: a.cfg.Attacher}
	ps.learner.ttl.Store(int64(ps.learnTTL(p)))
	if ps.srv, err = proxy.New(a.podProxy(ps, p)); err != nil {
		return nil, err
	}
	a.serve(ps)
	// Attach last: from now on the pod's connects come to a ready proxy.
	ps.applied = ps.direct()
	if ps.cgid, err = a.cfg.Attacher.AttachPod(p.Cgroup, a.kernelConfig(ps, p)); err != nil {
		return nil, fmt.Errorf("attach to cgroup %s: %w", p.Cgroup, err)
	}
	ps.learner.id.Store(ps.cgid)
	return ps, nil
}

// podProxy is the Config of pod p's proxy: the pod's own parts, and the
// node's Shared parts, Timeouts and Bounds (Config.Proxy), whole.
func (a *Agent) podProxy(ps *podState, p pods.Pod) proxy.Config {
	return proxy.Config{
		Mode:     proxy.Transparent,
		Resolver: bpfResolver{listeners: ps.listen, lookup: a.cfg.Attacher.OriginalDstOf},
		Policy:   ps.policy,
		Dial:     a.podDial(ps.ns, p),
		Source:   sourceOf(p),
		Logger:   a.log.With("pod", p.Name),
		Traces:   ps.traces,
		Learner:  ps.learner,
		Quota:    ps.quota,
		Shared:   a.shared,
		Timeouts: a.cfg.Proxy.Timeouts,
		Bounds:   a.cfg.Proxy.Bounds,
	}
}

// podDial dials from the pod's network namespace, with egret's mark.
func (a *Agent) podDial(ns *netns.NS, p pods.Pod) proxy.DialFunc {
	timeout := a.cfg.Proxy.DialTimeout
	if timeout <= 0 {
		timeout = proxy.DefaultDialTimeout
	}
	d := &netns.Dialer{NS: ns, Mark: a.cfg.Mark, Timeout: timeout}
	if a.cfg.WrapDial != nil {
		return a.cfg.WrapDial(p.Name, d.DialContext)
	}
	return d.DialContext
}

// openListeners opens the pod's listeners in its namespace (or adopts
// those kept for it): IPv4, and IPv6 where the namespace has it. Until they
// are served, they are closed by stop.
func (a *Agent) openListeners(ps *podState, p pods.Pod) error {
	port := cmp.Or(p.ListenPort, a.cfg.ListenPort)
	l4, l6 := listenAddrs(port)
	ln4, name4, err := a.listen(ps, "tcp4", l4)
	if err != nil {
		return fmt.Errorf("listen %s in %s: %w", l4, ps.ns.Path(), err)
	}
	ps.lns = []*acceptListener{newAcceptListener(ln4)}
	ps.kept = append(ps.kept, name4)
	ps.listen = []netip.AddrPort{addrPortOf(ln4.Addr())}
	// IPv6 is optional: a namespace without ::1 (IPv6 disabled) gets
	// IPv4 redirection only.
	if ln6, name6, err6 := a.listen(ps, "tcp6", l6); err6 == nil {
		ps.lns = append(ps.lns, newAcceptListener(ln6))
		ps.kept = append(ps.kept, name6)
		ps.listen = append(ps.listen, addrPortOf(ln6.Addr()))
	} else {
		a.log.Warn("no IPv6 listener; IPv6 connects go direct", "pod", p.Name, "err", err6)
	}
	return nil
}

// reportAmbiguous delivers the pod's ambiguous answers to the Reporter,
// if there is one, until ps.unwatch.
func (a *Agent) reportAmbiguous(ps *podState, p pods.Pod) {
	if a.cfg.Reporter == nil {
		return
	}
	ch, unwatch := ps.traces.Watch(engine.OutcomeAmbiguous, 64)
	ps.unwatch = unwatch
	go func() {
		for tr := range ch {
			a.cfg.Reporter.Ambiguous(p.Name, ambiguousRequest(&tr))
		}
	}()
}

// serve serves the pod's listeners with its proxy, each until it closes.
func (a *Agent) serve(ps *podState) {
	name := ps.pod.Name
	for _, l := range ps.lns {
		ps.served.Add(1)
		go func() {
			defer ps.served.Done()
			// The listener is closed when the pod stops (before the
			// server drains): that is the normal end too.
			if err := ps.srv.Serve(l); err != nil && !errors.Is(err, proxy.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
				a.log.Error("serve", "pod", name, "listener", l.Addr().String(), "err", err)
			}
		}()
	}
}

// checkCgroup refuses a pod whose cgroup is another pod's (removing
// one would detach the other) or contains egret's own cgroup (egret's own
// connects would be redirected to itself).
func (a *Agent) checkCgroup(p pods.Pod) error {
	cg := filepath.Clean(p.Cgroup)
	if self := a.cfg.SelfCgroup; self != "" {
		if rel, err := filepath.Rel(cg, filepath.Clean(self)); err == nil && (rel == "." || !strings.HasPrefix(rel, "..")) {
			return fmt.Errorf("%w: cgroup %s holds egret's own cgroup %s", ErrPodCgroup, cg, self)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, o := range a.pods {
		if name != p.Name && filepath.Clean(o.pod.Cgroup) == cg {
			return fmt.Errorf("%w: cgroup %s is already pod %s's: one cgroup per pod", ErrPodCgroup, cg, name)
		}
	}
	return nil

}

// sourceOf is the pod as its metrics name it.
func sourceOf(p pods.Pod) proxy.Source {
	return proxy.Source{Namespace: p.Namespace(), Pod: p.ShortName(), Workload: p.Workload}
}

// kernelConfig is what the kernel needs of pod p: its listeners, and what
// goes direct, the node policy's direct: section (the pod's policy source
// keeps the node's, an override cannot set it) with the pod's own laid
// over it: ports and CIDRs added, switches the pod sets winning.
func (ps *podState) kernelConfig(p pods.Pod) bpfload.PodConfig {
	d := ps.direct()
	cfg := bpfload.PodConfig{
		ExcludePorts:      append(slices.Clone(d.Ports), p.Exclude.Ports...),
		ExcludePrefixes:   append(slices.Clone(d.CIDRs), p.Exclude.CIDRs...),
		NoDefaultExcludes: p.Exclude.NoDefaultPorts || (!p.Exclude.DefaultPorts && !d.DefaultPorts),
		RedirectLoopback:  p.RedirectLoopback,
		NoLearn:           p.Learn.Off || (!p.Learn.On && !d.Learn),
	}
	for _, l := range ps.listen {
		if l.Addr().Is4() {
			cfg.Listen4 = l
		} else {
			cfg.Listen6 = l
		}
	}
	return cfg
}

// direct is the node policy's direct: section as the pod sees it.
func (ps *podState) direct() policy.Direct {
	if ps.policy == nil {
		return policy.Default().Direct
	}
	return ps.policy.Current().Direct
}

// learnTTL is how long the pod's learned destinations stay direct: its
// own TTL, else the node policy's.
func (ps *podState) learnTTL(p pods.Pod) time.Duration {
	if p.Learn.TTL > 0 {
		return p.Learn.TTL
	}
	return ps.direct().LearnTTL
}

// update applies a changed pod that stays in the same cgroup, namespace
// and port: exclusions and policy change in place.
func (ps *podState) update(a *Agent, p pods.Pod) error {
	ps.applied = ps.direct()
	if _, err := a.cfg.Attacher.AttachPod(p.Cgroup, a.kernelConfig(ps, p)); err != nil {
		return err
	}
	ps.policy.set(p)
	if ps.learner != nil {
		ps.learner.ttl.Store(int64(ps.learnTTL(p)))
	}
	ps.quota.SetLimits(a.podLimits(p))
	a.mu.Lock()
	ps.pod = p
	a.mu.Unlock()
	return nil
}

// stop stops the kernel redirecting the pod's new connects — by detaching
// it (detach set), or else by clearing its listeners from its config, so
// that the pinned links stay for the next agent — then, after Settle (for
// connects redirected just before to be accepted rather than reset),
// closes its listeners, so its port is free again. It returns drain,
// which lets in-flight requests finish (up to the grace period) and
// releases the rest; drain may run in the background.
func (ps *podState) stop(a *Agent, detach bool) (drain func() error, err error) {
	forget := func() error { return nil }
	switch {
	case ps.cgid == 0:
	case detach:
		f, derr := a.cfg.Attacher.DetachPodDrained(ps.cgid)
		if f != nil {
			forget = f
		}
		if derr != nil && !errors.Is(derr, os.ErrNotExist) {
			err = fmt.Errorf("detach: %w", derr)
		}
	default:
		cfg := ps.kernelConfig(ps.pod)
		cfg.Listen4, cfg.Listen6 = netip.AddrPort{}, netip.AddrPort{}
		if _, derr := a.cfg.Attacher.AttachPod(ps.pod.Cgroup, cfg); derr != nil {
			err = fmt.Errorf("stop redirecting: %w", derr)
		}
	}
	if len(ps.lns) > 0 && ps.cgid != 0 {
		// A pause with no event to wait on instead (see Config.Settle):
		// connects that ran the hook before the detach may still be on
		// their way to the listener.
		time.Sleep(a.cfg.Settle)
		// Connections redirected before the detach may still wait to be
		// accepted (a busy machine); closing now would reset them.
		if !waitAccepted(ps.lns, a.cfg.ShutdownGrace) {
			a.log.Warn("pod stop: connections still queued at the grace's end", "pod", ps.pod.Name)
		}
	}
	for _, l := range ps.lns {
		l.Close()
	}
	for _, name := range ps.kept {
		a.dropKept(name)
	}
	drain = func() error {
		var derr error
		if ps.srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownGrace)
			if e := ps.srv.Shutdown(ctx); e != nil {
				derr = fmt.Errorf("drain: %w", e)
			}
			cancel()
			ps.served.Wait()
		}
		// Every connection redirected before the detach was accepted
		// and resolved (or cut at the grace's end): their original
		// destinations can go.
		if e := forget(); e != nil {
			derr = errors.Join(derr, fmt.Errorf("forget destinations: %w", e))
		}
		if ps.unwatch != nil {
			if n := ps.unwatch(); n > 0 {
				a.log.Warn("ambiguous answers not reported (the reporter was behind)", "pod", ps.pod.Name, "dropped", n)
			}
		}
		if ps.ns != nil {
			ps.ns.Close()
		}
		return derr
	}
	return drain, err
}

func (ps *podState) listenStrings() []string {
	out := make([]string, len(ps.listen))
	for i, l := range ps.listen {
		out[i] = l.String()
	}
	return out
}

func (ps *podState) status() PodStatus {
	s := PodStatus{
		Name: ps.pod.Name, State: ps.state, Cgroup: ps.pod.Cgroup, CgroupID: ps.cgid,
		Netns: ps.pod.Netns, Listen: ps.listenStrings(), Since: ps.since,
	}
	if s.Netns == "" {
		s.Netns = "host"
	}
	if ps.err != nil {
		s.Error = ps.err.Error()
		s.Failures = ps.fails
	}
	if ps.policy != nil {
		s.Policy = ps.policy.Current().Source
	}
	if ps.quota != nil {
		l, u := ps.quota.Limits(), ps.quota.Usage()
		s.Limits, s.Usage = &l, &u
	}
	return s
}

// podPolicy is a pod's PolicySource: the node's policy with the pod's
// override laid over it, rebuilt when either changes. An override that no
// longer fits the node policy is logged and the node policy used.
type podPolicy struct {
	base proxy.PolicySource
	log  *slog.Logger

	mu       sync.Mutex
	name     string
	override []byte
	lastBase *policy.Policy
	cur      *policy.Policy
}

var _ proxy.PolicySource = (*podPolicy)(nil)

var _ PolicyReloads = (*policy.Watcher)(nil)

func newPodPolicy(base proxy.PolicySource, p pods.Pod, log *slog.Logger) *podPolicy {
	if base == nil {
		base = proxy.StaticPolicy{P: policy.Default()}
	}
	pp := &podPolicy{base: base, log: log}
	pp.set(p)
	return pp
}

func (pp *podPolicy) set(p pods.Pod) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.name = "pod " + p.Name
	pp.override = p.Policy
	pp.lastBase, pp.cur = nil, nil
}

func (pp *podPolicy) Current() *policy.Policy {
	b := pp.base.Current()
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if len(pp.override) == 0 {
		return b
	}
	if b != pp.lastBase || pp.cur == nil {
		o, err := policy.Overlay(b, pp.name, pp.override)
		if err != nil {
			// Logged once per node policy: the pod runs on the node's.
			pp.log.Error("pod policy override does not apply; using the node policy", "pod", pp.name, "err", err)
			o = b
		}
		pp.lastBase, pp.cur = b, o
	}
	return pp.cur
}

// ambiguousRequest is what a pod's Reporter hears of a request answered
// ambiguous, from its trace.
func ambiguousRequest(tr *retry.Trace) pods.AmbiguousRequest {
	return pods.AmbiguousRequest{RequestID: tr.RequestID, Method: tr.Method, URL: tr.URL,
		Upstream: tr.Upstream, Attempts: len(tr.Attempts)}
}
