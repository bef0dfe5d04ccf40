// Package services is the node's table of Kubernetes Services and their
// endpoints, for the proxy: which Service port a transparent destination
// (a ClusterIP:port, or a Host naming the Service) is, and which endpoint
// each attempt of a request to it dials.
//
// The table is fed by Run (one shared informer for Services and one for
// EndpointSlices, for the whole node) or by Apply in tests; it is read by
// the proxy's requests without a lock: an immutable index behind an
// atomic.Pointer, and per Service port an immutable endpoint set behind
// another, swapped whole by the informer's goroutine.
package services

import (
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egret-proxy/egret/retry"
)

// Reasons egret leaves a Service to kube-proxy: its requests keep going
// through the ClusterIP, attributed to the Service but not balanced by
// egret.
const (
	WhySessionAffinity    = "sessionAffinity ClientIP (kube-proxy keeps a client on one endpoint)"
	WhyInternalLocal      = "internalTrafficPolicy Local (only this node's endpoints)"
	WhyTrafficDistributed = "traffic distribution hints (trafficDistribution or topology-mode)"
	WhyNoSelector         = "no selector (endpoints managed by hand)"
)

// Outlier detection defaults.
const (
	// DefaultEjectAfter is how many failures in a row set an endpoint
	// aside.
	DefaultEjectAfter = 3
	// DefaultEjectBase is how long the first ejection lasts; each
	// ejection in a row doubles it, up to DefaultEjectMax.
	DefaultEjectBase = time.Second
	DefaultEjectMax  = 30 * time.Second
)

// Options tune a Table. The zero value is usable.
type Options struct {
	// ClusterDomain is the cluster's DNS domain (default cluster.local):
	// a Host NAME.NS.svc.ClusterDomain names Service NAME in NS.
	ClusterDomain string
	// EjectAfter, EjectBase, EjectMax: outlier detection (defaults above).
	EjectAfter int
	EjectBase  time.Duration
	EjectMax   time.Duration
	// Now is the clock of ejections (nil: time.Now).
	Now func() time.Time
	// Logger gets one line per Service egret leaves to kube-proxy, when it
	// is first seen so (nil: none).
	Logger *slog.Logger
}

// Table is the node's Services. Safe for concurrent use: requests read it
// (Service) without a lock while Apply changes it.
type Table struct {
	opts Options
	idx  atomic.Pointer[index]

	mu     sync.Mutex // Apply's
	svcs   map[string]*service
	logged map[string]string // Service -> the reason last logged

	goneMu      sync.Mutex
	gone        map[string]struct{}
	goneDropped uint64
	goneCh      chan struct{}
}

// New returns an empty table: every destination is no Service (requests
// go where the pod sent them) until Apply fills it.
func New(opts Options) *Table {
	if opts.ClusterDomain == "" {
		opts.ClusterDomain = "cluster.local"
	}
	opts.ClusterDomain = strings.ToLower(strings.Trim(opts.ClusterDomain, "."))
	if opts.EjectAfter <= 0 {
		opts.EjectAfter = DefaultEjectAfter
	}
	if opts.EjectBase <= 0 {
		opts.EjectBase = DefaultEjectBase
	}
	if opts.EjectMax <= 0 {
		opts.EjectMax = DefaultEjectMax
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	t := &Table{opts: opts, svcs: make(map[string]*service), logged: make(map[string]string),
		gone: make(map[string]struct{}), goneCh: make(chan struct{}, 1)}
	t.idx.Store(&index{})
	return t
}

// index finds a Service port by ClusterIP:port or by name and port. It is
// never changed once published.
type index struct {
	byIP   map[netip.AddrPort]*Port
	byName map[nameKey]*Port
	bySvc  map[string][]*Port // "namespace/name"
}

type nameKey struct {
	ns, name string
	port     uint16
}

// service is one Service as the informers last told it (Apply's side).
type service struct {
	ns, name string
	ips      []netip.Addr
	why      string
	ports    map[uint16]*Port // by Service port
	// slices are the Service's EndpointSlices by name.
	slices map[string]Slice
}

// Port is one port of one Service: what a request to ClusterIP:port goes
// to.
type Port struct {
	Namespace, Service string
	Number             uint16 // the Service's port
	portName           string // the Service port's name, for EndpointSlices
	// why egret leaves the Service to kube-proxy ("": egret balances).
	why string
	t   *Table
	eps atomic.Pointer[endpointSet]
	// known holds the endpoints by address across sets (Apply's side),
	// so that an endpoint's state outlives a change of its slice.
	known map[netip.AddrPort]*endpoint
}

// Name is the Service port's name for budgets, metrics and logs:
// "namespace/name:port".
func (p *Port) Name() string {
	return p.Namespace + "/" + p.Service + ":" + strconv.Itoa(int(p.Number))
}

// endpointSet is a Service port's endpoints at one moment: never changed
// once published.
type endpointSet struct {
	ready   []*endpoint
	serving []*endpoint // terminating but still serving
}

// endpoint is one endpoint's address and what requests learnt of it.
type endpoint struct {
	addr     string // host:port, as dialled
	inflight atomic.Int32
	fails    atomic.Int32 // failures in a row
	// until is when its ejection ends (unix nanoseconds; 0: none);
	// ejections how many in a row (each doubles the next).
	until     atomic.Int64
	ejections atomic.Int32
}

// Endpoint is one endpoint of a Slice.
type Endpoint struct {
	Addr netip.Addr
	// Ready, Serving, Terminating: the EndpointSlice's conditions (an
	// unknown Ready counts as ready, as the API says).
	Ready, Serving, Terminating bool
}

// SlicePort maps a Service port (by name: "" for an unnamed one) to the
// endpoints' port.
type SlicePort struct {
	Name string
	Port uint16
}

// Slice is one EndpointSlice of a Service.
type Slice struct {
	Ports     []SlicePort
	Endpoints []Endpoint
}

// ServicePort is one port of a Spec.
type ServicePort struct {
	Name string
	Port uint16
}

// Spec is what the table keeps of a Service.
type Spec struct {
	Namespace, Name string
	// ClusterIPs are the Service's virtual addresses (none: headless or
	// ExternalName, which the table ignores).
	ClusterIPs []netip.Addr
	Ports      []ServicePort
	// Unsupported says why egret leaves the Service to kube-proxy ("":
	// egret balances it).
	Unsupported string
}

func key(ns, name string) string { return ns + "/" + name }

// ApplyService adds or changes a Service (nil ClusterIPs: removes it).
func (t *Table) ApplyService(s Spec) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := key(s.Namespace, s.Name)
	if len(s.ClusterIPs) == 0 {
		if sv, ok := t.svcs[k]; ok {
			delete(t.svcs, k)
			delete(t.logged, k)
			for _, p := range sv.ports {
				t.drop(p)
			}
			t.publish()
		}
		return
	}
	sv := t.svcs[k]
	if sv == nil {
		sv = &service{ns: s.Namespace, name: s.Name, slices: make(map[string]Slice)}
		t.svcs[k] = sv
	}
	sv.ips, sv.why = s.ClusterIPs, s.Unsupported
	ports := make(map[uint16]*Port, len(s.Ports))
	for _, sp := range s.Ports {
		p := sv.ports[sp.Port]
		if p == nil || p.portName != sp.Name {
			p = &Port{Namespace: s.Namespace, Service: s.Name, Number: sp.Port, portName: sp.Name, t: t,
				known: make(map[netip.AddrPort]*endpoint)}
			p.eps.Store(&endpointSet{})
		}
		p.why = s.Unsupported
		ports[sp.Port] = p
	}
	for n, p := range sv.ports {
		if ports[n] != p {
			t.drop(p)
		}
	}
	sv.ports = ports
	if s.Unsupported != "" && t.logged[k] != s.Unsupported && t.opts.Logger != nil {
		t.opts.Logger.Info("Service left to kube-proxy: egret does not balance it", "service", k, "reason", s.Unsupported)
	}
	if s.Unsupported == "" {
		delete(t.logged, k)
	} else {
		t.logged[k] = s.Unsupported
	}
	t.rebuild(sv)
	t.publish()
}

// ApplySlice adds, changes or (nil) removes one EndpointSlice of Service
// ns/svc. A slice may come before its Service: it is kept until then.
func (t *Table) ApplySlice(ns, svc, slice string, s *Slice) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := key(ns, svc)
	sv := t.svcs[k]
	if sv == nil {
		if s == nil {
			return
		}
		// Not published until its Service comes (no ClusterIP, no entry).
		sv = &service{ns: ns, name: svc, slices: make(map[string]Slice)}
		t.svcs[k] = sv
	}
	if s == nil {
		delete(sv.slices, slice)
	} else {
		sv.slices[slice] = *s
	}
	t.rebuild(sv)
}

// maxGone bounds the addresses of endpoints that left and are not yet
// taken (TakeGone). Past it more are dropped: their pooled connections are
// never picked again, and close at the pool's idle timeout.
const maxGone = 1 << 16

// left records an endpoint address that left its Service (t.mu held).
func (t *Table) left(ap netip.AddrPort) {
	t.goneMu.Lock()
	if len(t.gone) < maxGone {
		t.gone[ap.String()] = struct{}{}
	} else {
		t.goneDropped++
	}
	t.goneMu.Unlock()
	select {
	case t.goneCh <- struct{}{}:
	default:
	}
}

// Gone is signalled when endpoints left their Service: TakeGone then has
// their addresses, whose pooled connections must close.
func (t *Table) Gone() <-chan struct{} { return t.goneCh }

// TakeGone returns the addresses (host:port) of the endpoints that left
// since it was last called, and how many were dropped past its bound.
func (t *Table) TakeGone() (addrs []string, dropped uint64) {
	t.goneMu.Lock()
	defer t.goneMu.Unlock()
	for a := range t.gone {
		addrs = append(addrs, a)
	}
	clear(t.gone)
	dropped, t.goneDropped = t.goneDropped, 0
	return addrs, dropped
}

// rebuild publishes new endpoint sets for sv's ports from its slices
// (t.mu held). An endpoint that stays keeps its state; one that left is
// forgotten, and reported to the table's Gone listeners.
func (t *Table) rebuild(sv *service) {
	for _, p := range sv.ports {
		seen := make(map[netip.AddrPort]bool, len(p.known))
		set := &endpointSet{}
		for _, sl := range sv.slices {
			port, ok := slicePort(sl.Ports, p.portName)
			if !ok {
				continue
			}
			for _, e := range sl.Endpoints {
				ap := netip.AddrPortFrom(e.Addr.Unmap(), port)
				if seen[ap] || !(e.Ready || e.Serving) {
					continue
				}
				seen[ap] = true
				ep := p.known[ap]
				if ep == nil {
					ep = &endpoint{addr: ap.String()}
					p.known[ap] = ep
				}
				if e.Ready && !e.Terminating {
					set.ready = append(set.ready, ep)
				} else if e.Serving {
					set.serving = append(set.serving, ep)
				}
			}
		}
		for ap := range p.known {
			if !seen[ap] {
				delete(p.known, ap)
				t.left(ap)
			}
		}
		p.eps.Store(set)
	}
}

// drop forgets a port that left its Service (t.mu held): its endpoints
// are gone.
func (t *Table) drop(p *Port) {
	for ap := range p.known {
		t.left(ap)
	}
	clear(p.known)
	p.eps.Store(&endpointSet{})
}

func slicePort(ps []SlicePort, name string) (uint16, bool) {
	for _, sp := range ps {
		if sp.Name == name && sp.Port != 0 {
			return sp.Port, true
		}
	}
	return 0, false
}

// publish builds and publishes the index (t.mu held).
func (t *Table) publish() {
	idx := &index{byIP: make(map[netip.AddrPort]*Port), byName: make(map[nameKey]*Port), bySvc: make(map[string][]*Port)}
	for _, sv := range t.svcs {
		for n, p := range sv.ports {
			for _, ip := range sv.ips {
				idx.byIP[netip.AddrPortFrom(ip.Unmap(), n)] = p
			}
			idx.byName[nameKey{sv.ns, sv.name, n}] = p
			idx.bySvc[key(sv.ns, sv.name)] = append(idx.bySvc[key(sv.ns, sv.name)], p)
		}
	}
	t.idx.Store(idx)
}

// Lookup returns the Service port whose ClusterIP:port is dst, nil if
// none.
func (t *Table) Lookup(dst netip.AddrPort) *Port {
	return t.idx.Load().byIP[netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())]
}

// Named returns the Service port host names on port (NAME.NS,
// NAME.NS.svc, NAME.NS.svc.DOMAIN), nil if none. The caller decides
// whether the name may apply to its destination.
func (t *Table) Named(host string, port uint16) *Port {
	ns, name, ok := t.parseName(host)
	if !ok {
		return nil
	}
	return t.idx.Load().byName[nameKey{ns, name, port}]
}

// parseName reads NAME.NS[.svc[.DOMAIN]] (case-insensitively, a final dot
// allowed).
func (t *Table) parseName(host string) (ns, name string, ok bool) {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	h = strings.TrimSuffix(h, "."+t.opts.ClusterDomain)
	h = strings.TrimSuffix(h, ".svc")
	name, ns, ok = strings.Cut(h, ".")
	if !ok || name == "" || ns == "" || strings.Contains(ns, ".") {
		return "", "", false
	}
	return ns, name, true
}

// Unsupported says why egret leaves the Service to kube-proxy: "" when
// egret balances it.
func (p *Port) Unsupported() string { return p.why }

// Endpoints returns a chooser of p's endpoints for one request (for
// retry.Exchange.Endpoints), nil when egret leaves p to kube-proxy.
func (p *Port) Endpoints() retry.Endpoints {
	if p.why != "" {
		return nil
	}
	return &Pick{p: p}
}

// Ready is the number of p's ready endpoints (with ServingOnly, the
// terminating ones still serving used when none is ready).
func (p *Port) Ready() (ready, servingOnly int) {
	s := p.eps.Load()
	return len(s.ready), len(s.serving)
}

// Pick chooses p's endpoints for one request's attempts: among the ready
// endpoints (the terminating-but-serving ones when none is ready, as
// kube-proxy does), not set aside and not yet failed by this request, the
// less busy of two chosen at random (power of two choices). An endpoint
// that failed the request is picked again only when no other is left.
type Pick struct {
	p      *Port
	cur    *endpoint
	failed []*endpoint
}

var _ retry.Endpoints = (*Pick)(nil)

// Pick implements retry.Endpoints.
func (k *Pick) Pick() (string, bool) {
	s := k.p.eps.Load()
	cands := s.ready
	if len(cands) == 0 {
		cands = s.serving
	}
	if len(cands) == 0 {
		return "", false
	}
	now := k.p.t.opts.Now().UnixNano()
	var a, b *endpoint
	// Up to a few draws for two acceptable ones; then a scan, so that a
	// set mostly failed or set aside still finds what is left.
	for range 4 {
		e := cands[rand.IntN(len(cands))]
		if !k.ok(e, now) {
			continue
		}
		if a == nil {
			a = e
		} else if e != a {
			b = e
			break
		}
	}
	if a == nil {
		a = k.scan(cands, now)
	}
	if b != nil && b.inflight.Load() < a.inflight.Load() {
		a = b
	}
	a.inflight.Add(1)
	k.cur = a
	return a.addr, true
}

// ok says whether e may be picked: not failed by this request and not set
// aside.
func (k *Pick) ok(e *endpoint, now int64) bool {
	for _, f := range k.failed {
		if f == e {
			return false
		}
	}
	return e.until.Load() <= now
}

// scan finds an acceptable endpoint the draws missed: one not failed by
// this request and not set aside, else one not failed by this request,
// else any (every endpoint failed it: one of them again).
func (k *Pick) scan(cands []*endpoint, now int64) *endpoint {
	off := rand.IntN(len(cands))
	var notFailed *endpoint
	for i := range cands {
		e := cands[(off+i)%len(cands)]
		if k.ok(e, now) {
			return e
		}
		if notFailed == nil && !k.failedIt(e) {
			notFailed = e
		}
	}
	if notFailed != nil {
		return notFailed
	}
	return cands[off]
}

func (k *Pick) failedIt(e *endpoint) bool {
	for _, f := range k.failed {
		if f == e {
			return true
		}
	}
	return false
}

// Done implements retry.Endpoints: the attempt on the endpoint Pick chose
// ended.
func (k *Pick) Done(failed bool) {
	e := k.cur
	if e == nil {
		return
	}
	k.cur = nil
	e.inflight.Add(-1)
	if !failed {
		e.fails.Store(0)
		e.ejections.Store(0)
		return
	}
	if !k.failedIt(e) {
		k.failed = append(k.failed, e)
	}
	if int(e.fails.Add(1)) >= k.p.t.opts.EjectAfter {
		k.p.eject(e)
	}
}

// eject sets e aside for a time that doubles with each ejection in a row,
// unless half of the port's endpoints are already set aside.
func (p *Port) eject(e *endpoint) {
	o := &p.t.opts
	now := o.Now().UnixNano()
	if e.until.Load() > now {
		return // already aside
	}
	s := p.eps.Load()
	cands := s.ready
	if len(cands) == 0 {
		cands = s.serving
	}
	aside := 0
	for _, x := range cands {
		if x.until.Load() > now {
			aside++
		}
	}
	if (aside+1)*2 > len(cands) {
		return
	}
	n := e.ejections.Add(1)
	d := o.EjectBase << min(n-1, 16)
	if d > o.EjectMax || d <= 0 {
		d = o.EjectMax
	}
	e.fails.Store(0)
	e.until.Store(now + int64(d))
}

// Aside reports whether the endpoint at addr is set aside now (tests and
// the admin API).
func (p *Port) Aside(addr string) bool {
	now := p.t.opts.Now().UnixNano()
	s := p.eps.Load()
	for _, l := range [][]*endpoint{s.ready, s.serving} {
		for _, e := range l {
			if e.addr == addr {
				return e.until.Load() > now
			}
		}
	}
	return false
}

// Service implements the proxy's Services: the Service port at dst (a
// ClusterIP:port), or the one host names when dst is one of its
// endpoints (the pod chose the endpoint: the dial goes there, eps nil).
// eps is nil, and why says why, for a Service egret leaves to kube-proxy;
// for one it balances, a new Pick (which, with no endpoint, answers each
// attempt at once, without a dial).
func (t *Table) Service(dst netip.AddrPort, host string) (svc string, port uint16, eps retry.Endpoints, why string, ok bool) {
	if p := t.Lookup(dst); p != nil {
		if p.why == "" {
			eps = &Pick{p: p}
		}
		return p.Namespace + "/" + p.Service, p.Number, eps, p.why, true
	}
	if host == "" {
		return "", 0, nil, "", false
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return "", 0, nil, "", false
	}
	ns, name, found := t.parseName(host)
	if !found {
		return "", 0, nil, "", false
	}
	want := netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()).String()
	for _, p := range t.idx.Load().bySvc[key(ns, name)] {
		s := p.eps.Load()
		for _, l := range [][]*endpoint{s.ready, s.serving} {
			for _, e := range l {
				if e.addr == want {
					return ns + "/" + name, p.Number, nil, "", true
				}
			}
		}
	}
	return "", 0, nil, "", false
}
