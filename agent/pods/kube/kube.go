// Package kube is the pods.Source of a Kubernetes node: the pods bound to
// the node (field selector spec.nodeName=NODE) that opted in with the
// annotation egret.dev/enabled: "true", each with the cgroup v2 the
// kubelet made for it and the network namespace of its sandbox.
//
// An informer lists and watches the pods; on every change, and every
// RetryInterval, the source works out the set of pods it can put behind
// egret and sends the difference from what it sent before (pods.Memory
// does the diffing). A pod is in the set when it opted in, its
// annotations are all good, it is Running (or Pending with its sandbox up,
// where its init containers run), and its cgroup and namespace are found.
// A pod whose cgroup or namespace is not there yet is looked at again on
// its updates and on the timer; a pod whose annotations are bad, or that
// uses the node's network, is left out (its connects go direct) and
// reported: OnError, and a Warning Event on the pod when the source has a
// Recorder. Succeeded, Failed and deleted pods are Removed. See README.md.
package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/internal/cgroup2"
)

// Sentinel errors; match them with errors.Is.
var (
	// ErrConfig: a Config the source cannot run with.
	ErrConfig = errors.New("kube: bad pod source configuration")
	// ErrAnnotation: a pod's egret annotation cannot be used (the error is
	// an *AnnotationError naming the pod, the annotation and why).
	ErrAnnotation = errors.New("kube: bad egret annotation")
	// ErrCgroupNotFound: none of the cgroups the kubelet would give the
	// pod exists (yet).
	ErrCgroupNotFound = errors.New("kube: pod cgroup not found")
	// ErrNetnsNotFound: no process of the pod's cgroup shows its network
	// namespace (yet).
	ErrNetnsNotFound = errors.New("kube: pod network namespace not found")
	// ErrHostNetwork: a pod on the node's network opted in. egret cannot
	// put it behind a listener of its own: its namespace is the node's,
	// shared with every other such pod and the node's own services, and
	// the agent's is not the node's.
	ErrHostNetwork = errors.New("kube: a pod on the node's network (hostNetwork) cannot be put behind egret")
	// ErrWatch: listing or watching the node's pods failed (the informer
	// retries).
	ErrWatch = errors.New("kube: listing or watching pods failed")
)

// Defaults of Config.
const (
	DefaultRetryInterval = 2 * time.Second
	DefaultPendingReport = time.Minute
	// Component is the source of the Events NewRecorder writes.
	Component = "egret-agent"
)

// DefaultNetnsDirs are where CRI runtimes bind pod network namespaces
// (containerd and CRI-O: /var/run/netns, which is /run/netns).
var DefaultNetnsDirs = []string{"/run/netns", "/var/run/netns"}

// Event reasons of the Warning Events the source writes on pods.
const (
	ReasonBadAnnotation = "EgretBadAnnotation"
	ReasonNotFound      = "EgretPodNotFound"
	ReasonHostNetwork   = "EgretHostNetwork"
)

// Config configures a Source.
type Config struct {
	// Client reaches the API server's core/v1 API (required; NewClient
	// makes one).
	Client rest.Interface
	// NodeName is the node whose pods the source watches (required).
	NodeName string
	// CgroupRoot is where cgroup v2 is mounted for the agent
	// (cgroup2.Root() if empty).
	CgroupRoot string
	// KubeletCgroupRoot is the kubelet's --cgroup-root ("" for none, the
	// default): the pods' cgroups are below it.
	KubeletCgroupRoot string
	// Driver is the kubelet's cgroup driver (DriverAuto if empty).
	Driver Driver
	// NetnsDirs are searched for a bind mount of a pod's namespace, a
	// reference that outlives its processes (DefaultNetnsDirs if nil).
	NetnsDirs []string
	// RetryInterval is how often pods waiting for their cgroup or
	// namespace are looked at again, and found ones checked
	// (DefaultRetryInterval if 0).
	RetryInterval time.Duration
	// PendingReport: a Running pod whose cgroup or namespace is still not
	// found after this long is reported once (DefaultPendingReport if 0).
	PendingReport time.Duration
	// OnError, if set, is told about bad annotations (once per pod and
	// problem), pods not found for PendingReport, and list/watch failures.
	// It may be called from more than one goroutine.
	OnError func(error)
	// Recorder, if set, gets a Warning Event on the pod for each problem
	// OnError is told about (NewRecorder makes one).
	Recorder record.EventRecorder
	// Logger gets debug lines (pods waiting); nil for none.
	Logger *slog.Logger
}

// Source is the Kubernetes pods.Source. Run it once at a time.
type Source struct {
	cfg     Config
	hostNS  nsID
	running atomic.Bool
	// store is the running informer's, for Ambiguous.
	store atomic.Pointer[cache.Store]
}

var _ pods.Source = (*Source)(nil)

// New checks cfg and returns a Source.
func New(cfg Config) (*Source, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: no Kubernetes client", ErrConfig)
	}
	if cfg.NodeName == "" {
		return nil, fmt.Errorf("%w: no node name", ErrConfig)
	}
	d, err := ParseDriver(string(cfg.Driver))
	if err != nil {
		return nil, err
	}
	cfg.Driver = d
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = cgroup2.Root()
	}
	if fi, err := os.Stat(cfg.CgroupRoot); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: cgroup root %s: not a directory (%v)", ErrConfig, cfg.CgroupRoot, err)
	}
	if cfg.NetnsDirs == nil {
		cfg.NetnsDirs = DefaultNetnsDirs
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if cfg.PendingReport <= 0 {
		cfg.PendingReport = DefaultPendingReport
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	host, err := statNS(procRoot + "/self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("%w: own network namespace: %v", ErrConfig, err)
	}
	return &Source{cfg: cfg, hostNS: host}, nil
}

const procRoot = "/proc"

// Run implements pods.Source: it watches the node's pods until ctx ends.
// The pods found when the informer has synced are sent as Added, then
// Synced, then the changes.
func (s *Source) Run(ctx context.Context, events chan<- pods.Event) error {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Run called while running", ErrConfig)
	}
	defer s.running.Store(false)

	ctx, cancel := context.WithCancel(ctx)
	node := fields.OneTermEqualSelector("spec.nodeName", s.cfg.NodeName).String()
	lw := cache.NewFilteredListWatchFromClient(s.cfg.Client, "pods", metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.FieldSelector = node })
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	defer cancel()
	store := inf.GetStore()
	s.store.Store(&store)
	defer s.store.Store(nil)

	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	// The source reads metadata, spec and status; a pod's managed fields
	// are often its largest part, so the cache does without them.
	if err := inf.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
		}
		return obj, nil
	}); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		if ctx.Err() == nil && !routineWatchEnd(err) {
			s.report(fmt.Errorf("%w (node %s): %v", ErrWatch, s.cfg.NodeName, err))
		}
	}); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	informed := make(chan struct{})
	go func() {
		defer close(informed)
		inf.Run(ctx.Done())
	}()
	defer func() {
		cancel()
		<-informed // the informer's goroutines have ended
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}

	r := &run{s: s, located: map[types.UID]location{}, reported: map[types.UID]string{}, waiting: map[types.UID]time.Time{}}
	mem, _ := pods.NewMemory()
	r.reconcile(inf.GetStore().List(), mem)
	memErr := make(chan error, 1)
	go func() { memErr <- mem.Run(ctx, events) }()
	tick := time.NewTicker(s.cfg.RetryInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			<-memErr
			return ctx.Err()
		case err := <-memErr:
			return err
		case <-wake:
		case <-tick.C:
		}
		r.reconcile(inf.GetStore().List(), mem)
	}
}

// routineWatchEnd: a watch that ended as watches do (expired resource
// version, closed stream); the informer lists again without a word.
func routineWatchEnd(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

func (s *Source) report(err error) {
	if s.cfg.OnError != nil {
		s.cfg.OnError(err)
	}
}

// location is where a pod was found.
type location struct {
	cgroup string
	netns  string // "" for a host-network pod
	id     nsID
}

// run is the state of one Run.
type run struct {
	s *Source
	// located caches where each pod is, checked on every reconcile.
	located map[types.UID]location
	// reported holds the problem last reported per pod, so that each is
	// reported once.
	reported map[types.UID]string
	// waiting: since when a Running pod's cgroup or namespace is sought.
	waiting map[types.UID]time.Time
}

// reconcile works out the pods to put behind egret from the informer's
// objects and brings mem to that set.
func (r *run) reconcile(objs []any, mem *pods.Memory) {
	want := map[string]pods.Pod{}
	seen := map[types.UID]bool{}
	for _, o := range objs {
		pod, ok := o.(*corev1.Pod)
		if !ok || pod.Spec.NodeName != r.s.cfg.NodeName || !OptedIn(pod) {
			continue
		}
		seen[pod.UID] = true
		p, ok := r.resolve(pod)
		if ok {
			want[p.Name] = p
		}
	}
	for uid := range r.located {
		if !seen[uid] {
			delete(r.located, uid)
		}
	}
	for uid := range r.reported {
		if !seen[uid] {
			delete(r.reported, uid)
		}
	}
	for uid := range r.waiting {
		if !seen[uid] {
			delete(r.waiting, uid)
		}
	}

	for name := range mem.Pods() {
		if _, ok := want[name]; !ok {
			_ = mem.Remove(name)
		}
	}
	have := mem.Pods()
	for name, p := range want {
		if old, ok := have[name]; !ok || !old.Equal(p) {
			if err := mem.Put(p); err != nil {
				r.s.report(err) // cannot happen: a located pod has a name and a cgroup
			}
		}
	}
}

// resolve returns the pod as egret runs it, if it can now.
func (r *run) resolve(pod *corev1.Pod) (pods.Pod, bool) {
	p, err := Parse(pod)
	if err != nil {
		r.problem(pod, ReasonBadAnnotation, err, "the pod is left out (its connects go direct) until the annotation is fixed")
		return pods.Pod{}, false
	}
	if pod.Spec.HostNetwork {
		r.problem(pod, ReasonHostNetwork, fmt.Errorf("%w: pod %s", ErrHostNetwork, p.Name),
			"the pod is left out (its connects go direct)")
		return pods.Pod{}, false
	}
	if m := MeshSidecar(pod); m != "" {
		r.problem(pod, ReasonMeshSidecar, fmt.Errorf("%w: pod %s: %s", ErrMeshSidecar, p.Name, m),
			"the pod is left out: its connects go direct, to the mesh's sidecar, which retries on its own; behind egret as well, a request could be retried by both (deploy/README.md, \"Beside a service mesh or an eBPF CNI\")")
		return pods.Pod{}, false
	}
	switch pod.Status.Phase {
	case corev1.PodRunning:
	case corev1.PodPending:
		// Its init containers run while it is Pending, in its sandbox:
		// behind egret as soon as its cgroup and namespace are there.
		// Until then (image pulls, scheduling) nothing is reported; it
		// is looked at again on its updates and on the timer.
		delete(r.waiting, pod.UID)
		loc, err := r.locate(pod)
		if err != nil {
			return pods.Pod{}, false
		}
		p.Cgroup, p.Netns = loc.cgroup, loc.netns
		return p, true
	default:
		// Succeeded, Failed: not in the set, so Removed if it was.
		delete(r.waiting, pod.UID)
		return pods.Pod{}, false
	}
	loc, err := r.locate(pod)
	if err != nil {
		since, ok := r.waiting[pod.UID]
		if !ok {
			since = time.Now()
			r.waiting[pod.UID] = since
			r.s.cfg.Logger.Debug("pod waiting for its cgroup or namespace", "pod", p.Name, "err", err)
		}
		if time.Since(since) >= r.s.cfg.PendingReport {
			r.problem(pod, ReasonNotFound, err, fmt.Sprintf("running for %v and still not found; the pod's connects go direct", time.Since(since).Round(time.Second)))
		}
		return pods.Pod{}, false
	}
	delete(r.waiting, pod.UID)
	if r.reported[pod.UID] != "" {
		r.s.cfg.Logger.Info("pod problem resolved", "pod", p.Name)
		delete(r.reported, pod.UID)
	}
	p.Cgroup, p.Netns = loc.cgroup, loc.netns
	return p, true
}

// ReasonAmbiguous is the reason of the Warning Event Ambiguous records.
const ReasonAmbiguous = "EgretAmbiguous"

// Ambiguous records a Warning Event (ReasonAmbiguous) on the pod named
// namespace/name: egret answered its request r ambiguous. The URL is
// given without its query string (it may carry a token). A pod the source
// does not know (gone meanwhile) gets none. It implements the agent's
// Reporter.
func (s *Source) Ambiguous(pod string, r pods.AmbiguousRequest) {
	sp := s.store.Load()
	if sp == nil || s.cfg.Recorder == nil {
		return
	}
	obj, ok, err := (*sp).GetByKey(pod)
	if err != nil || !ok {
		return
	}
	u := r.URL
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		u = u[:i]
	}
	s.cfg.Recorder.Eventf(obj.(*corev1.Pod), corev1.EventTypeWarning, ReasonAmbiguous,
		"request %s: %s %s to %s may have run upstream: egret cannot tell, so it did not retry and answered Egret-Outcome: ambiguous after %d attempt(s) (egret explain %s)",
		r.RequestID, r.Method, u, r.Upstream, r.Attempts, r.RequestID)
}

// problem reports err about pod once (until it changes or goes away).
func (r *run) problem(pod *corev1.Pod, reason string, err error, what string) {
	msg := err.Error()
	if r.reported[pod.UID] == msg {
		return
	}
	r.reported[pod.UID] = msg
	r.s.report(fmt.Errorf("%w; %s", err, what))
	if r.s.cfg.Recorder != nil {
		r.s.cfg.Recorder.Event(pod, corev1.EventTypeWarning, reason, strings.ReplaceAll(msg, "\n", "; ")+"; "+what)
	}
}

// locate finds the pod's cgroup and namespace, or checks that where it
// was found before still holds.
func (r *run) locate(pod *corev1.Pod) (location, error) {
	if loc, ok := r.located[pod.UID]; ok {
		if r.stillThere(loc) {
			return loc, nil
		}
		delete(r.located, pod.UID)
	}
	cg, err := r.s.locateCgroup(pod)
	if err != nil {
		return location{}, err
	}
	loc := location{cgroup: cg}
	loc.netns, loc.id, err = r.s.locateNetns(PodName(pod), cg)
	if err != nil {
		return location{}, err
	}
	r.located[pod.UID] = loc
	return loc, nil
}

func (r *run) stillThere(loc location) bool {
	if fi, err := os.Stat(loc.cgroup); err != nil || !fi.IsDir() {
		return false
	}
	if loc.netns == "" {
		return true
	}
	id, err := statNS(loc.netns)
	return err == nil && id == loc.id
}
