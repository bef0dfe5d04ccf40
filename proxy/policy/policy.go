// Package policy is egret's retry policy file: a strictly decoded YAML
// document that says, per upstream (matched by host and port), how many
// attempts, which timeouts, which backoff and budget, which routes are
// idempotent, how bodies are buffered, whether to speak TLS and how to
// refresh a bearer credential. It turns the matched upstream into a Retry,
// what one request to it allows (the proxy converts it for its attempt
// runner), and a Watcher reloads the file on change without ever replacing a
// good policy by a bad one. It imports nothing of the retry layer.
//
// A Policy is immutable once built: share it freely between goroutines.
package policy

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egret-proxy/egret/engine"
)

// Protocol is how egret speaks to an upstream.
type Protocol string

const (
	// ProtocolAuto: HTTP/2 when TLS ALPN agrees, else HTTP/1.1; HTTP/1.1
	// over cleartext.
	ProtocolAuto Protocol = "auto"
	// ProtocolHTTP1: HTTP/1.1 only.
	ProtocolHTTP1 Protocol = "http1"
	// ProtocolH2: HTTP/2 over TLS (needs tls.enabled).
	ProtocolH2 Protocol = "h2"
	// ProtocolH2C: HTTP/2 with prior knowledge over cleartext.
	ProtocolH2C Protocol = "h2c"
)

// Default body limits: bodies up to MemoryLimit are held in memory, up to
// SpoolLimit spooled to a file, and streamed once beyond.
const (
	DefaultMemoryLimit int64 = 64 << 10
	DefaultSpoolLimit  int64 = 8 << 20
	// DefaultRefreshTimeout bounds a credential refresh command.
	DefaultRefreshTimeout = 10 * time.Second
	// DefaultLearnTTL is how long a learned-direct destination stays
	// direct unless direct.learn.ttl says otherwise (the agent's
	// bpfload.DefaultLearnTTL).
	DefaultLearnTTL = 10 * time.Minute
)

// IdempotencyKeyHeader is the header an upstream that honours keys reads,
// the one the attempt runner resolves idempotency with.
const IdempotencyKeyHeader = engine.IdempotencyKeyHeader

// BodyLimits sizes request body buffering (bytes).
type BodyLimits struct {
	MemoryLimit int64
	SpoolLimit  int64
}

// Route declares the idempotency of requests by method and path prefix.
type Route struct {
	// Method is an HTTP method (case-sensitive) or "*" for any.
	Method string
	// PathPrefix starts with "/"; it matches whole path segments:
	// "/v1/orders" matches "/v1/orders" and "/v1/orders/7", not
	// "/v1/orders-old". A prefix ending in "/" matches anything under it.
	PathPrefix string
	Idempotent bool
}

// TLS is TLS origination: the pod speaks plain HTTP, egret speaks TLS to the
// upstream. File paths are absolute after parsing.
type TLS struct {
	Enabled            bool
	ServerName         string
	CAFile             string
	CertFile           string
	KeyFile            string
	InsecureSkipVerify bool
}

// Credential is a bearer token egret refreshes after a 401.
type Credential struct {
	// BearerTokenFile holds the token (surrounding white space ignored).
	BearerTokenFile string
	// RefreshCommand, when set, is run (argv, no shell) to renew the file
	// before it is read again; RefreshTimeout bounds it.
	RefreshCommand []string
	RefreshTimeout time.Duration
	// Dir is the folder the command runs in: the policy file's, so that
	// relative paths in it mean what they mean in the file.
	Dir string
	// CleartextAddresses are the destination addresses a token may be
	// sent to without TLS (credential.cleartext_addresses). A credential
	// without TLS and without this list is refused when the policy loads.
	CleartextAddresses []netip.Prefix
}

// Upstream is the resolved policy of one upstream entry (or of the
// defaults): every field set, inherited ones included.
type Upstream struct {
	// Name keys the node-wide retry budget. An entry's `name`, else its
	// host and port; for the defaults and for entries without a fixed port
	// Match fills in the destination's own host:port, so each destination
	// gets its own budget unless entries are grouped by name.
	Name string
	// Host is the pattern: an exact host, "*.suffix", or "" for the
	// defaults. Port is 0 for any port.
	Host string
	Port int

	MaxAttempts    int
	Timeout        time.Duration // overall, waits included; 0: none
	AttemptTimeout time.Duration // one attempt up to response headers; 0: none
	MinAttempt     time.Duration
	Backoff        engine.Backoff
	Budget         engine.BudgetConfig
	// TransientStatuses are extra 5xx statuses retried for idempotent
	// requests. Read-only: it is shared.
	TransientStatuses     []int
	HonoursIdempotencyKey bool
	InjectIdempotencyKey  bool
	// MethodDefault: the RFC 9110 idempotent methods count as idempotent.
	MethodDefault bool
	// Routes in precedence order (longest prefix first, a method before
	// "*"). Read-only.
	Routes     []Route
	Bulkhead   int // concurrent attempts; 0: unlimited
	Body       BodyLimits
	Protocol   Protocol
	TLS        TLS
	Credential Credential

	named bool // Name came from the file, or host and port are fixed
	// origins says where each field set by the file came from (Fields).
	origins   map[string]fieldOrigin
	tlsConfig *tls.Config
	tlsID     string // digest of what tlsConfig was built from
	refresher *Refresher
	refresh   func(ctx context.Context, req *http.Request) error
	// dests keeps the copies made for destinations (an entry without a
	// fixed name), so that a request does not copy the entry.
	dests *destCache
}

// destCache holds an unnamed entry's per-destination copies, up to
// maxDests of them (then a request gets a copy of its own).
type destCache struct {
	m sync.Map // dest -> *Upstream
	n atomic.Int32
}

type dest struct {
	host string
	port int
}

const maxDests = 4096

func newDestCache() *destCache { return &destCache{} }

// Policy is a parsed policy file: the defaults and the upstream entries.
type Policy struct {
	// Source names where it came from ("embedded defaults" or a file).
	Source    string
	Defaults  *Upstream
	Upstreams []*Upstream
	// Warnings are legal but risky settings (certificate checks off); a
	// Watcher logs them.
	Warnings []string
	// DenyDestinations are addresses egret never connects to for a client
	// in explicit mode (deny_destinations; DefaultDenyDestinations when the
	// file says nothing, none when it gives an empty list).
	DenyDestinations []netip.Prefix
	// Direct is what the node's pods reach directly, never through egret
	// (the direct: section): the agent writes it into each pod's kernel
	// config, with the pod's own settings, and again on every reload.
	Direct Direct

	docs    []*rawDoc // the layers it was resolved from, for Overlay
	parents []*Policy // for an overlay: the policies of docs[:1], docs[:2]...
	exact   map[string]map[int]*Upstream
	wild    map[string]map[int]*Upstream // key: ".suffix"
	files   []string                     // TLS files, watched for rotation
}

// Direct is the direct: section: destinations every pod reaches directly
// (the kernel's connect hook never redirects them to egret), and whether
// destinations egret passes through are learned direct. A pod's own
// settings (the pods file's exclude: and learn:, or its annotations) add
// ports and CIDRs, and override the switches.
type Direct struct {
	// Ports and CIDRs go direct for every pod.
	Ports []uint16
	CIDRs []netip.Prefix
	// DefaultPorts keeps the agent's default direct ports (the
	// server-speaks-first and database protocols); default true.
	DefaultPorts bool
	// Learn: destinations egret passes through are learned direct;
	// default true. LearnTTL is how long one stays direct (default
	// DefaultLearnTTL).
	Learn    bool
	LearnTTL time.Duration
}

// Equal reports whether d and e say the same.
func (d Direct) Equal(e Direct) bool {
	return slices.Equal(d.Ports, e.Ports) && slices.Equal(d.CIDRs, e.CIDRs) &&
		d.DefaultPorts == e.DefaultPorts && d.Learn == e.Learn && d.LearnTTL == e.LearnTTL
}

// TLSOrigin says which entries of a policy may originate TLS for a
// transparent destination (TLSOriginFor): the pod's plain HTTP to such a
// destination must keep coming to egret, so it is never learned direct.
type TLSOrigin struct {
	// Always: the policy may originate TLS for the destination whatever
	// its name: the defaults originate TLS, or an entry names the
	// destination's address, or a wildcard entry (whose addresses cannot
	// be known) covers its port.
	Always bool
	// Names are the exact host names of entries that originate TLS on the
	// destination's port: they apply when the name resolves to the
	// destination's address.
	Names []string
}

// TLSOriginFor returns the entries that may originate TLS for dst (an
// entry applies to dst when it has dst's port or no port).
func (p *Policy) TLSOriginFor(dst netip.AddrPort) TLSOrigin {
	var o TLSOrigin
	if p == nil {
		return o
	}
	if p.Defaults != nil && p.Defaults.TLS.Enabled {
		o.Always = true
		return o
	}
	a := dst.Addr().Unmap()
	for _, u := range p.Upstreams {
		if !u.TLS.Enabled || (u.Port != 0 && u.Port != int(dst.Port())) {
			continue
		}
		if _, wild := cutWildcard(u.Host); wild || u.Service() {
			// A Service's ClusterIPs are the agent's to know, not the
			// policy's: any destination may be one.
			o.Always = true
			return o
		}
		if h, err := netip.ParseAddr(u.Host); err == nil {
			if h.Unmap() == a {
				o.Always = true
				return o
			}
			continue
		}
		o.Names = append(o.Names, u.Host)
	}
	return o
}

// DefaultDenyDestinations are the link-local addresses where clouds serve
// instance metadata and credentials: IPv4 and IPv6 link-local (AWS, GCP,
// Azure and OpenStack at 169.254.169.254), AWS's IPv6 endpoint
// fd00:ec2::254 and Alibaba's 100.100.100.200.
func DefaultDenyDestinations() []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("fe80::/10"),
		netip.MustParsePrefix("fd00:ec2::254/128"),
		netip.MustParsePrefix("100.100.100.200/32"),
	}
}

// Denied reports whether a is in the policy's deny_destinations.
func (p *Policy) Denied(a netip.Addr) bool {
	a = a.Unmap()
	for _, pf := range p.DenyDestinations {
		if pf.Contains(a) {
			return true
		}
	}
	return false
}

// CredentialAllowed reports whether the upstream's bearer token may be sent
// on a request to the destination address dst: the upstream has a
// credential, and either egret speaks TLS to it or dst is one of its
// credential.cleartext_addresses (an invalid dst, a destination egret
// resolves itself, matches no address).
func (u *Upstream) CredentialAllowed(dst netip.Addr) bool {
	if u.refresher == nil {
		return false
	}
	if u.TLS.Enabled {
		return true
	}
	dst = dst.Unmap()
	for _, pf := range u.Credential.CleartextAddresses {
		if dst.IsValid() && pf.Contains(dst) {
			return true
		}
	}
	return false
}

// builtin is the embedded default upstream policy: the spec's simulate
// defaults with a 15 s overall timeout.
func builtin() Upstream {
	return Upstream{
		MaxAttempts:   engine.DefaultMaxAttempts,
		Timeout:       DefaultTimeout,
		MinAttempt:    engine.DefaultMinAttempt,
		Backoff:       engine.DefaultBackoff,
		Budget:        engine.DefaultBudget,
		MethodDefault: true,
		Body:          BodyLimits{MemoryLimit: DefaultMemoryLimit, SpoolLimit: DefaultSpoolLimit},
		Protocol:      ProtocolAuto,
	}
}

// Default returns the embedded policy: no upstream entries, and defaults of
// 3 attempts, full jitter 25 ms to 1 s, minimum attempt 50 ms, budget 0.2 /
// 10 a second / 10 s, 15 s overall timeout, 64 KiB in memory, 8 MiB
// spooled.
func Default() *Policy {
	p, err := build("embedded defaults", nil, nil)
	if err != nil {
		panic("policy: embedded defaults do not build: " + err.Error())
	}
	return p
}

// Match returns the policy of the upstream at host and port: the most
// specific entry (an exact host before any wildcard, a longer wildcard
// suffix before a shorter, then a fixed port before any port), else the
// defaults. Host is matched case-insensitively, without a trailing dot;
// an IPv6 literal may come with or without brackets. The result has its
// Name filled in; do not modify it.
func (p *Policy) Match(host string, port int) *Upstream {
	h := normalizeHost(host)
	if strings.Contains(h, "/") {
		// No host name has a slash: the keys of `service:` entries have
		// one, and only MatchService reaches them.
		return p.Defaults.forDestination(h, port)
	}
	if u := pick(p.exact[h], port); u != nil {
		return u.forDestination(h, port)
	}
	for i := 0; i < len(h); i++ {
		if h[i] != '.' {
			continue
		}
		if u := pick(p.wild[h[i:]], port); u != nil {
			return u.forDestination(h, port)
		}
	}
	return p.Defaults.forDestination(h, port)
}

// MatchService returns the policy of port of the Kubernetes Service
// namespace/name: its `service:` entry (a fixed port before any port),
// else the defaults. An entry without a name, and the defaults, are named
// "namespace/name:port", as the agent names the Service in budgets,
// metrics and logs.
func (p *Policy) MatchService(namespace, name string, port int) *Upstream {
	k := namespace + "/" + name
	if u := pick(p.exact[k], port); u != nil {
		return u.forDestination(k, port)
	}
	return p.Defaults.forDestination(k, port)
}

// Service reports whether the entry is a `service:` one.
func (u *Upstream) Service() bool { return strings.Contains(u.Host, "/") }

func pick(byPort map[int]*Upstream, port int) *Upstream {
	if byPort == nil {
		return nil
	}
	if u := byPort[port]; u != nil {
		return u
	}
	return byPort[0]
}

// Named reports whether the policy fixes the upstream's name (an entry's
// `name`, or an entry with a fixed host and port), rather than Match
// naming it after the destination (the defaults, wildcard hosts, entries
// without a port). Metrics give a named upstream a label of its own.
func (u *Upstream) Named() bool { return u.named }

// forDestination returns u itself when its budget name is fixed, else a
// copy named after the destination.
func (u *Upstream) forDestination(host string, port int) *Upstream {
	if u.named {
		return u
	}
	if u.dests != nil {
		if c, ok := u.dests.m.Load(dest{host, port}); ok {
			return c.(*Upstream)
		}
	}
	c := *u
	c.Name, c.dests = net.JoinHostPort(host, strconv.Itoa(port)), nil
	if u.dests != nil {
		// A slot is taken before the copy is stored, so that the cache
		// never holds more than maxDests however many race for it.
		if u.dests.n.Add(1) <= maxDests {
			if prev, loaded := u.dests.m.LoadOrStore(dest{host, port}, &c); loaded {
				u.dests.n.Add(-1)
				return prev.(*Upstream)
			}
		} else {
			u.dests.n.Add(-1)
		}
	}
	return &c
}

func normalizeHost(h string) string {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	h = strings.TrimSuffix(h, ".")
	if strings.Contains(h, ":") { // IPv6: one spelling of each address
		if ip := net.ParseIP(h); ip != nil {
			return ip.String()
		}
	}
	return strings.ToLower(h)
}

// Route returns the route that decides a request, if any: the longest
// matching prefix, a route naming the method before a "*" one. The path is
// cleaned first ("//a/./b" is "/a/b") and a query is ignored, so a request
// cannot escape a route by spelling its path differently.
func (u *Upstream) Route(method, p string) (Route, bool) {
	if len(u.Routes) == 0 {
		return Route{}, false
	}
	p = cleanPath(p)
	for _, r := range u.Routes {
		if (r.Method == "*" || r.Method == method) && prefixMatch(r.PathPrefix, p) {
			return r, true
		}
	}
	return Route{}, false
}

func cleanPath(p string) string {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i]
	}
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	trailing := strings.HasSuffix(p, "/")
	p = path.Clean(p)
	if trailing && p != "/" {
		p += "/"
	}
	return p
}

func prefixMatch(prefix, p string) bool {
	if !strings.HasPrefix(p, prefix) {
		return false
	}
	return len(p) == len(prefix) || strings.HasSuffix(prefix, "/") || p[len(prefix)] == '/'
}

// Idempotency returns the idempotency policy for a request to method and
// path (spec section 1): the route if one matches, else the upstream's keys
// and method default.
func (u *Upstream) Idempotency(method, path string) engine.Idempotency {
	id := engine.Idempotency{
		HonoursKeys:      u.HonoursIdempotencyKey,
		MethodDefaultOff: !u.MethodDefault,
	}
	if r, ok := u.Route(method, path); ok {
		id.RouteSet, id.Route = true, r.Idempotent
	}
	return id
}

// Idempotent resolves whether the request is safely idempotent: route,
// then Idempotency-Key (hasKey) on an upstream that honours keys, then the
// method default.
func (u *Upstream) Idempotent(method, path string, hasKey bool) bool {
	return u.Idempotency(method, path).Resolve(method, hasKey)
}

// ShouldInjectKey reports whether the proxy should add a fresh
// Idempotency-Key (NewIdempotencyKey) to this request: the upstream injects
// keys, the request has none, and it is not idempotent otherwise. A route
// that declares the request not idempotent wins over keys, so no key is
// injected there.
func (u *Upstream) ShouldInjectKey(method, path string, hasKey bool) bool {
	return u.InjectsKey(u.Idempotency(method, path), method, hasKey)
}

// InjectsKey is ShouldInjectKey for a request whose idempotency policy id
// is already resolved (its RetryPolicy's Idempotency): the route is not
// matched a second time.
func (u *Upstream) InjectsKey(id engine.Idempotency, method string, hasKey bool) bool {
	return u.InjectIdempotencyKey && !hasKey && !id.RouteSet && !id.Resolve(method, false)
}

// NewIdempotencyKey returns a fresh random key (a UUID version 4).
func NewIdempotencyKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:], b[10:])
	return string(out[:])
}

// Retry is what one request to an upstream allows: its attempts, timeouts,
// backoff, budget (named by Upstream), transient statuses, idempotency and
// credential refresh. The proxy converts it into its attempt runner's
// policy where it hands the request over.
type Retry struct {
	// Upstream names the retry budget, e.g. "api.example.com:443".
	Upstream    string
	MaxAttempts int
	// Timeout bounds the whole request, waits included (0: none);
	// AttemptTimeout one attempt up to its response head (0: none);
	// MinAttempt is the least time worth starting an attempt in.
	Timeout           time.Duration
	AttemptTimeout    time.Duration
	MinAttempt        time.Duration
	Backoff           engine.Backoff
	Budget            engine.BudgetConfig
	TransientStatuses []int
	Idempotency       engine.Idempotency
	// Refresh, when set, renews the credential after a 401 and rewrites
	// the request's credentials.
	Refresh func(ctx context.Context, req *http.Request) error
}

// DefaultTimeout is the embedded default's overall timeout of a request.
const DefaultTimeout = 15 * time.Second

// RetryPolicy is the Retry of one request to this upstream. Its
// Idempotency carries the matched route, the upstream's keys and method
// default; the attempt runner resolves it with the request's own
// Idempotency-Key header (after any injection). Refresh is set when the
// upstream has a credential: it renews the token and sets
// "Authorization: Bearer <token>" on the request.
func (u *Upstream) RetryPolicy(method, path string) Retry {
	return Retry{
		Upstream:          u.Name,
		MaxAttempts:       u.MaxAttempts,
		Timeout:           u.Timeout,
		AttemptTimeout:    u.AttemptTimeout,
		MinAttempt:        u.MinAttempt,
		Backoff:           u.Backoff,
		Budget:            u.Budget,
		TransientStatuses: u.TransientStatuses,
		Idempotency:       u.Idempotency(method, path),
		Refresh:           u.refresh,
	}
}

// Refresher returns the upstream's credential refresher, or nil when it has
// no credential. It is shared by every request to the upstream under this
// Policy.
func (u *Upstream) Refresher() *Refresher { return u.refresher }

// TLSConfig returns a fresh copy of the upstream's TLS client configuration,
// or nil when TLS origination is off. ServerName is empty when the policy
// names none: the caller sets the destination host. The files were loaded
// when the policy was parsed; a Watcher reloads when they change.
func (u *Upstream) TLSConfig() *tls.Config {
	if u.tlsConfig == nil {
		return nil
	}
	return u.tlsConfig.Clone()
}

// TLSConfigID identifies the content of TLSConfig: the settings and the
// files (CA, client certificate and key) as they were read. Two upstreams
// with the same ID speak TLS alike; the ID changes when a file does and
// the policy is reloaded. "" when TLS origination is off.
func (u *Upstream) TLSConfigID() string { return u.tlsID }
