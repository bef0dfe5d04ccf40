package proxy

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/retry"
)

// Proof says how a request's upstream was identified.
type Proof uint8

const (
	// ProofDialed: explicit mode. egret resolves and dials the request
	// URL's host itself, so the upstream is what that host names.
	ProofDialed Proof = iota
	// ProofAddress: transparent mode, the upstream is the original
	// destination's address: the Host header is that address (or
	// absent), or it names no policy entry; the entry for the address,
	// else the defaults, applies.
	ProofAddress
	// ProofDNS: the Host header names a policy entry and that name
	// resolves (egret's own resolver) to the original destination.
	ProofDNS
	// ProofTLS: the Host header names an entry to which egret originates
	// TLS with certificate checks, and the name did not resolve to the
	// destination: only a server holding a certificate for that name can
	// answer. The budget and bulkhead are the destination's own, since the
	// proof comes only with the handshake.
	ProofTLS
	// ProofMismatch: the Host header names an entry the destination is not
	// shown to be: that entry does not apply; the destination's own (by
	// address) does.
	ProofMismatch
)

func (p Proof) String() string {
	switch p {
	case ProofDialed:
		return "dialed"
	case ProofAddress:
		return "address"
	case ProofDNS:
		return "dns"
	case ProofTLS:
		return "tls"
	case ProofMismatch:
		return "mismatch"
	}
	return "proof(" + strconv.Itoa(int(p)) + ")"
}

// Identity is who a request's upstream is, decided once per request (by
// the connection, before the body is read) and passed down to what needs
// it: the policy entry, the budget and bulkhead key, whether the entry's
// credential may be sent, the name TLS verifies.
type Identity struct {
	// Upstream is the policy entry that applies.
	Upstream *policy.Upstream
	// Host names the upstream for TLS (server name when the entry gives
	// none): the Host header's name when proven, else the destination's
	// address.
	Host string
	// Dest is the original destination (transparent mode); the zero
	// value in explicit mode.
	Dest netip.AddrPort
	// Budget keys the node-wide retry budget and the bulkhead.
	Budget string
	// Port is the destination port. (The small fields last: the
	// request's one allocation stays in its size class.)
	Port  uint16
	Proof Proof
	// Credential: the entry's bearer token may be sent (and refreshed
	// after a 401).
	Credential bool
	// Service is the Kubernetes Service port the destination is
	// ("namespace/name:port"; transparent mode with Config.Services),
	// Endpoints its endpoints' chooser for this request (nil: the dial
	// goes to the destination, the ClusterIP, as the pod sent it), and
	// ServiceNote why egret leaves the Service to kube-proxy.
	Service     string
	Endpoints   retry.Endpoints
	ServiceNote string
}

// Services tells which Kubernetes Service a transparent request goes to
// (agent/services.Table, one per node). Service returns the Service
// ("namespace/name") and its port at dst: dst is one of its ClusterIPs, or
// host names it and dst is one of its endpoints. eps chooses the endpoints
// of the request's attempts; nil when the dial goes to dst as the pod sent
// it, why then saying why egret leaves the Service to kube-proxy (empty:
// the pod chose the endpoint itself). ok false: dst is no Service.
type Services interface {
	Service(dst netip.AddrPort, host string) (svc string, port uint16, eps retry.Endpoints, why string, ok bool)
}

// service attributes a transparent request to its Kubernetes Service, if
// it goes to one: the Service's `service:` entry applies (a fixed port
// before any port), else one the Host names and the destination is shown
// to be (identify's rules), else the defaults, named after the Service.
func (c *conn) service(ctx context.Context, pol *policy.Policy, tg target) (Identity, bool) {
	svc, port, eps, why, ok := c.s.cfg.Services.Service(c.dst, tg.host)
	if !ok {
		return Identity{}, false
	}
	ns, name, _ := strings.Cut(svc, "/")
	up := pol.MatchService(ns, name, int(port))
	id := Identity{Upstream: up, Host: c.dstHost, Port: uint16(tg.port), Dest: c.dst, Budget: up.Name,
		Proof: ProofAddress, Credential: up.CredentialAllowed(c.dst.Addr())}
	if !up.Service() {
		// No entry names the Service: a Host entry proven for the
		// destination applies, else the defaults under its name.
		if byHost := c.identify(ctx, pol, tg); byHost.Upstream.Host != "" {
			id = byHost
		}
	}
	id.Service = ns + "/" + name + ":" + strconv.Itoa(int(port))
	id.Endpoints, id.ServiceNote = eps, why
	if why != "" {
		id.ServiceNote = "Service " + id.Service + " left to kube-proxy (through its ClusterIP): " + why
	}
	return id, true
}

// identify decides the identity of a request to tg under pol. In explicit
// mode the URL's host is the upstream. In transparent mode the original
// destination is: an entry the Host header names applies only when the
// destination is shown to be that upstream (ProofDNS, ProofTLS); otherwise
// the destination's own entry does (ProofAddress, ProofMismatch).
func (c *conn) identify(ctx context.Context, pol *policy.Policy, tg target) Identity {
	if c.s.cfg.Mode == Explicit {
		up := pol.Match(tg.host, tg.port)
		var lit netip.Addr
		if a, err := netip.ParseAddr(tg.host); err == nil {
			lit = a
		}
		return Identity{Upstream: up, Host: tg.host, Port: uint16(tg.port), Budget: up.Name, Proof: ProofDialed,
			Credential: up.CredentialAllowed(lit)}
	}
	dst := c.dst
	byAddr := func(p Proof) Identity {
		a := c.dstHost
		up := pol.Match(a, tg.port)
		return Identity{Upstream: up, Host: a, Port: uint16(tg.port), Dest: dst, Budget: up.Name, Proof: p,
			Credential: up.CredentialAllowed(dst.Addr())}
	}
	h := tg.host
	if a, err := netip.ParseAddr(h); err == nil || h == "" {
		if err == nil && a.Unmap() != dst.Addr() {
			return byAddr(ProofMismatch)
		}
		return byAddr(ProofAddress)
	}
	up := pol.Match(h, tg.port)
	if up.Host == "" {
		// No entry for the name: nothing of another upstream's to take;
		// the destination is the upstream.
		return byAddr(ProofAddress)
	}
	id := Identity{Upstream: up, Host: h, Port: uint16(tg.port), Dest: dst, Budget: up.Name}
	switch {
	case c.s.cfg.Names.Resolves(ctx, h, dst.Addr()):
		id.Proof = ProofDNS
	case up.TLS.Enabled && !up.TLS.InsecureSkipVerify:
		id.Proof, id.Budget = ProofTLS, dst.String()
	default:
		return byAddr(ProofMismatch)
	}
	id.Credential = up.CredentialAllowed(dst.Addr())
	return id
}

// Names tells whether a host name resolves to an address, through egret's
// own resolver (never the pod's), remembering answers: one per node,
// shared by every pod's Server. A name whose remembered addresses lack the
// one asked about is looked up again, at most once per Refresh, so that a
// moved service is recognised within a second. Safe for concurrent use.
type Names struct {
	// Resolver looks names up (nil: net.DefaultResolver).
	Resolver *net.Resolver
	// TTL is how long an answer is trusted (default 30 s); Refresh how
	// often a name may be looked up again when an address is missing from
	// its answer (default 1 s); Timeout bounds a look-up (default 2 s).
	TTL, Refresh, Timeout time.Duration
	// Max bounds the names remembered (default 4096); beyond it the
	// oldest answers are forgotten.
	Max int

	mu sync.Mutex
	m  map[string]*nameEntry
}

type nameEntry struct {
	addrs []netip.Addr
	at    time.Time     // when the answer came
	ready chan struct{} // closed when the look-up ends
}

// Resolves reports whether host resolves to a. A failed look-up or one
// that does not finish in Timeout (or before ctx ends) is false.
func (n *Names) Resolves(ctx context.Context, host string, a netip.Addr) bool {
	if n == nil {
		return false
	}
	ttl, refresh := orDefault(n.TTL, 30*time.Second), orDefault(n.Refresh, time.Second)
	n.mu.Lock()
	if n.m == nil {
		n.m = make(map[string]*nameEntry)
	}
	e := n.m[host]
	now := time.Now()
	if e != nil {
		select {
		case <-e.ready:
			age := now.Sub(e.at)
			if age < ttl && (contains(e.addrs, a) || age < refresh) {
				n.mu.Unlock()
				return contains(e.addrs, a)
			}
			e = nil // stale, or lacking a and old enough to ask again
		default: // a look-up in progress: wait for it below
		}
	}
	if e == nil {
		e = &nameEntry{ready: make(chan struct{})}
		n.evict()
		n.m[host] = e
		go n.lookup(host, e)
	}
	n.mu.Unlock()
	if ctx.Err() != nil {
		return false
	}
	select {
	case <-e.ready:
		return contains(e.addrs, a)
	case <-ctx.Done():
		return false
	}
}

// lookup resolves host into e; it runs on its own so that a request that
// gives up waiting does not cut the look-up others wait for.
func (n *Names) lookup(host string, e *nameEntry) {
	r := n.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	ctx, cancel := context.WithTimeout(context.Background(), orDefault(n.Timeout, 2*time.Second))
	addrs, _ := r.LookupNetIP(ctx, "ip", host)
	cancel()
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	n.mu.Lock()
	e.addrs, e.at = addrs, time.Now()
	n.mu.Unlock()
	close(e.ready)
}

// evict makes room for one more name (n.mu held): answers past their TTL
// go first, then the oldest.
func (n *Names) evict() {
	max := n.Max
	if max <= 0 {
		max = 4096
	}
	if len(n.m) < max {
		return
	}
	var oldest string
	var oldestAt time.Time
	for h, e := range n.m {
		select {
		case <-e.ready:
		default:
			continue
		}
		if oldest == "" || e.at.Before(oldestAt) {
			oldest, oldestAt = h, e.at
		}
	}
	if oldest != "" {
		delete(n.m, oldest)
	}
}

func contains(addrs []netip.Addr, a netip.Addr) bool {
	for _, x := range addrs {
		if x == a {
			return true
		}
	}
	return false
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
