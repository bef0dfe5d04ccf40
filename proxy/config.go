package proxy

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/retry"
	"github.com/egret-proxy/egret/witness"
)

// Defaults of the Config's timeouts and bounds.
const (
	DefaultSniffTimeout       = 300 * time.Millisecond
	DefaultReadHeaderTimeout  = 10 * time.Second
	DefaultReadTimeout        = 30 * time.Second
	DefaultWriteTimeout       = 30 * time.Second
	DefaultIdleTimeout        = 90 * time.Second
	DefaultDialTimeout        = 10 * time.Second
	DefaultMaxHeaderBytes     = 64 << 10
	DefaultMaxHeaderCount     = 100
	DefaultAnswerGrace        = time.Second
	DefaultRequestReadTimeout = 2 * time.Minute
	DefaultTunnelIdleTimeout  = 5 * time.Minute
	DefaultParkAfter          = time.Second
)

// DefaultConnectPorts are the ports an explicit-mode CONNECT may reach
// when Bounds.ConnectPorts is empty.
var DefaultConnectPorts = []int{443}

// Config configures a Server: the parts that are its own (one pod's, in
// the node agent), then three groups, each given whole: the Shared parts
// of every Server of the process, its Timeouts and its Bounds. `egret
// proxy`'s one server and every pod's of the agent are made the same way:
// their own parts, and the process's Shared (NewShared), Timeouts and
// Bounds. Zero fields take the defaults.
type Config struct {
	Mode Mode
	// Resolver gives original destinations (required in Transparent mode).
	Resolver Resolver
	// Policy is consulted for every request (default: policy.Default()).
	Policy PolicySource
	// Dial dials upstreams, passthrough destinations and CONNECT targets
	// (default: a net.Dialer with DialTimeout).
	Dial DialFunc
	// Source is who sends this server's requests (the agent's pod), for
	// the per-workload series of Metrics.
	Source Source
	Logger *slog.Logger
	// Traces keeps this server's recent requests' traces (default: a
	// store of its own).
	Traces *Traces
	// Learner, when set, is told of each transparent connection sniffed
	// as a protocol egret passes through (Learner says which), so that the
	// pod's next connects to that destination can go direct; the node
	// agent's writes the kernel's learned-direct map. Destinations the
	// policy may originate TLS for (Policy.TLSOriginFor; a named entry's
	// name proven by Names) are never learned: the pod's plain HTTP to
	// them must keep reaching egret. nil: nothing is learned.
	Learner Learner
	// Limits bound what the clients of this Server (one pod, in the node
	// agent) may hold at once; zero fields are no limit. Ignored when
	// Quota is set.
	Limits Limits
	// Quota is the account of this Server's clients against their limits
	// and the node's descriptors (nil: one of the Server's own, of Limits,
	// drawing from Shared.FDs). The node agent gives each pod's Server the
	// pod's, whose limits it changes in place.
	Quota *Quota
	// Runner, when set, replaces the retry runner (tests of the server
	// alone). It is handed each request's retry.Exchange.
	Runner Runner

	Shared
	Timeouts
	Bounds
}

// Shared is what every Server of a process has in common: the parts one
// per node (budgets, bulkheads, names, services, witness, tap, metrics, the
// descriptor account) and how requests are logged and spooled. The node
// agent gives the same Shared to every pod's Server; NewShared makes the
// parts not given.
type Shared struct {
	// Witness reads upstream sockets' counters for the attempt runner
	// (nil: none, so no evidence is ever upgraded).
	Witness witness.Witness
	// Budgets are the per-upstream retry budgets (nil: the server's own).
	Budgets *engine.Budgets
	// Bulkheads (nil: a registry of the server's own, its rejections
	// counted by Metrics).
	Bulkheads *Bulkheads
	// Names proves transparent requests' Host names against their original
	// destinations (egret's resolver, never the pod's); one per node
	// (default: a Names of the server's own on net.DefaultResolver). In
	// explicit mode, without a Dial, its Resolver resolves the names egret
	// dials.
	Names *Names
	// Services, when set, tells which Kubernetes Service a transparent
	// destination is (agent/services, one per node): such a request is
	// attributed to the Service (budget, bulkhead, metrics, logs and
	// traces name it "namespace/name:port", a `service:` policy entry
	// applies) and, unless egret leaves the Service to kube-proxy, its
	// attempts dial the Service's endpoints, chosen by the Services.
	Services Services
	// Tap gets every finished request, for `egret observe` (nil: none).
	Tap *Tap
	// Metrics count what only the proxy sees (egret_proxy_...);
	// RetryMetrics the attempt runner's attempts, decisions, outcomes and
	// witness upgrades (egret_retry_...). Either may be nil.
	Metrics      *Metrics
	RetryMetrics *retry.Metrics
	// FDs is the account of the descriptors the process lets its clients
	// take, which every Server's Quota draws from (nil: none).
	FDs *FDs

	// AccessLog says which requests are logged (default: all).
	AccessLog AccessLog
	// LogQuery keeps the query string of request URLs in log lines and
	// traces; by default it is dropped (with any user:password), so that
	// tokens passed in URLs do not reach log storage.
	LogQuery bool
	// SpoolDir holds spooled request bodies (default: the system's).
	SpoolDir string
	// Via, when set, is the pseudonym added to forwarded requests' Via
	// header in Explicit mode ("1.1 <Via>"); transparent requests are left
	// as the workload wrote them.
	Via string
}

// NewShared returns s with the parts it lacks made, one for the process:
// Budgets, Names, Metrics and RetryMetrics (registered with reg, which may
// be nil), Bulkheads (their rejections counted by Metrics), Tap and a
// TCP_INFO Witness. FDs, Services and the settings are left as given.
func NewShared(reg prometheus.Registerer, s Shared) (Shared, error) {
	var err error
	if s.Metrics == nil {
		if s.Metrics, err = NewMetrics(reg); err != nil {
			return Shared{}, err
		}
	}
	if s.RetryMetrics == nil {
		if s.RetryMetrics, err = retry.NewMetrics(reg); err != nil {
			return Shared{}, err
		}
	}
	if s.Tap == nil {
		s.Tap = NewTap(0)
	}
	if s.Witness == nil {
		s.Witness = witness.TCPInfo{}
	}
	s.setDefaults()
	return s, nil
}

// setDefaults makes the parts a Server cannot do without.
func (s *Shared) setDefaults() {
	if s.Names == nil {
		s.Names = &Names{}
	}
	if s.Budgets == nil {
		s.Budgets = engine.NewBudgets()
	}
	if s.Bulkheads == nil {
		s.Bulkheads = NewBulkheads()
		s.Bulkheads.OnReject = s.Metrics.BulkheadRejected
	}
}

// Timeouts bound how long a Server waits, for its clients and upstreams.
type Timeouts struct {
	// SniffTimeout is how long a transparent connection may stay silent
	// before it is taken for a server-speaks-first protocol.
	SniffTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request head; ReadTimeout bounds
	// each read of a request body; WriteTimeout each write to the client;
	// IdleTimeout a keep-alive connection's wait for its next request.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	DialTimeout       time.Duration
	// RequestReadTimeout bounds the reading of a whole request from the
	// client, head and body, from its first byte: a body trickled a byte
	// at a time ends there (408), whatever ReadTimeout allows each read.
	RequestReadTimeout time.Duration
	// TunnelIdleTimeout ends a CONNECT tunnel when neither side has sent
	// a byte for that long.
	TunnelIdleTimeout time.Duration
	// ParkAfter is how long a keep-alive connection waits for its next
	// request with a goroutine of its own; idle longer, it is parked (on
	// Linux): it holds no goroutine and no buffer for the rest of
	// IdleTimeout, and a goroutine is started again when its socket is
	// readable or its peer goes. Negative: never parked.
	ParkAfter time.Duration
	// AnswerGrace is how long, once Shutdown's grace is over, the
	// requests still in flight have to be answered (their attempts
	// cancelled) before their connections are closed.
	AnswerGrace time.Duration
}

// Bounds bound what a client may send a Server and reach through it.
type Bounds struct {
	// MaxHeaderBytes bounds a request head (request line included) and
	// MaxHeaderCount its header fields; beyond: 431 (414 for the line).
	MaxHeaderBytes int
	MaxHeaderCount int
	// ConnectPorts are the ports an explicit-mode CONNECT may reach
	// (default: DefaultConnectPorts, 443 only).
	ConnectPorts []int
	// Protect are addresses (host:port) egret serves besides its proxy
	// listeners, such as the metrics and pprof address: in explicit mode
	// no request or CONNECT reaches them, nor the Server's own listeners.
	Protect []string
}

func (c *Config) setDefaults() {
	c.Timeouts.setDefaults()
	c.Bounds.setDefaults()
	c.Shared.setDefaults()
	if c.Quota == nil {
		c.Quota = NewQuota(c.Limits, c.FDs)
	}
	if c.Policy == nil {
		c.Policy = StaticPolicy{policy.Default()}
	}
	if c.Traces == nil {
		c.Traces = NewTraces(0)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (t *Timeouts) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&t.SniffTimeout, DefaultSniffTimeout)
	def(&t.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&t.ReadTimeout, DefaultReadTimeout)
	def(&t.WriteTimeout, DefaultWriteTimeout)
	def(&t.IdleTimeout, DefaultIdleTimeout)
	def(&t.DialTimeout, DefaultDialTimeout)
	def(&t.AnswerGrace, DefaultAnswerGrace)
	def(&t.RequestReadTimeout, DefaultRequestReadTimeout)
	def(&t.TunnelIdleTimeout, DefaultTunnelIdleTimeout)
	if t.ParkAfter == 0 {
		t.ParkAfter = DefaultParkAfter
	}
}

func (b *Bounds) setDefaults() {
	if b.MaxHeaderBytes <= 0 {
		b.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if b.MaxHeaderCount <= 0 {
		b.MaxHeaderCount = DefaultMaxHeaderCount
	}
	if len(b.ConnectPorts) == 0 {
		b.ConnectPorts = DefaultConnectPorts
	}
}
