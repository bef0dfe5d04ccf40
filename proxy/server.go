package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egret-proxy/egret/internal/rawsock"
	"github.com/egret-proxy/egret/proxy/policy"
)

// Mode is how a Server learns where a request goes.
type Mode uint8

const (
	// Explicit: the client uses the proxy as its HTTP_PROXY and sends
	// absolute-form requests; CONNECT opens a byte-for-byte tunnel.
	Explicit Mode = iota
	// Transparent: connections were redirected to the proxy; a Resolver
	// gives each one's original destination. Anything that is not
	// HTTP/1.x is passed through to it untouched.
	Transparent
)

func (m Mode) String() string {
	if m == Transparent {
		return "transparent"
	}
	return "explicit"
}

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("proxy: server closed")

// ErrConfig: a Config that cannot work (e.g. transparent without Resolver).
var ErrConfig = errors.New("proxy: invalid config")

// DialFunc dials an upstream, a passthrough destination or a CONNECT
// target. The node agent gives one that dials from the pod's network
// namespace.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Learner learns destinations the pod can reach directly: ones egret
// passes through, where its hop adds nothing and costs the pod the
// kernel's own answer (a refused connect becomes a reset after the pod
// wrote). LearnDirect is called from connection goroutines, concurrently,
// once per connection sniffed as proto; an error is logged, the connection
// is served all the same.
type Learner interface {
	LearnDirect(dst netip.AddrPort, proto Protocol) error
}

// Learnable reports whether a connection sniffed as p tells that its
// destination is one egret passes through: every protocol but HTTP/1.x
// (and an HTTP/1.1 Upgrade, which is HTTP until the switch).
func Learnable(p Protocol) bool {
	switch p {
	case ProtoHTTP1, ProtoUpgrade, "":
		return false
	}
	return true
}

// PolicySource gives the policy in force now. *policy.Watcher satisfies it;
// the agent gives each pod a source of its own overlaid policy.
type PolicySource interface {
	Current() *policy.Policy
}

// StaticPolicy is a PolicySource that never changes.
type StaticPolicy struct{ P *policy.Policy }

// Current returns the policy.
func (s StaticPolicy) Current() *policy.Policy { return s.P }

var _ PolicySource = StaticPolicy{}

// via is the Via field value the proxy adds to a request of version
// major.minor ("1.1 egret").
func (s *Server) via(major, minor int) string {
	if major == 1 && minor == 1 {
		return s.via11
	}
	return strconv.Itoa(major) + "." + strconv.Itoa(minor) + " " + s.cfg.Via
}

// Server is one proxy listener's logic: the node agent runs one per pod,
// `egret proxy` one in explicit mode. Serve may be called for several
// listeners.
type Server struct {
	cfg    Config
	runner Runner
	bases  *bases

	draining atomic.Bool
	closing  atomic.Bool
	// cut is set when Shutdown's grace is over: in-flight requests are
	// answered and their connections closed.
	cut atomic.Bool
	// changed is signalled when a connection ends or changes state, or a
	// Serve loop ends (signal).
	changed chan struct{}
	// ctx is cancelled when Shutdown gives up waiting: in-flight attempts
	// end then.
	ctx    context.Context
	cancel context.CancelFunc

	via11 string // "1.1 " + cfg.Via
	// protect: Config.Protect, parsed.
	protect []netip.AddrPort

	// park holds idle connections without a goroutine (nil: none on
	// this system); parkAfter is Config.ParkAfter, 0 when nothing parks.
	// parked counts this server's parked connections; onPark, a test's
	// hook, is called (under the parker's lock) when that count changes.
	park      *parker
	parkAfter time.Duration
	parked    atomic.Int64
	onPark    func()

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	shut      bool // Shutdown has ended: an accepted connection is closed
}

// New checks cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Mode == Transparent && cfg.Resolver == nil {
		return nil, fmt.Errorf("%w: transparent mode needs a Resolver", ErrConfig)
	}
	if cfg.Mode != Transparent && cfg.Mode != Explicit {
		return nil, fmt.Errorf("%w: mode %d", ErrConfig, cfg.Mode)
	}
	cfg.setDefaults()
	cfg.Metrics.exposeBudgets(cfg.Budgets)
	s := &Server{
		cfg:       cfg,
		via11:     "1.1 " + cfg.Via,
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),
		changed:   make(chan struct{}, 1),
	}
	for _, a := range cfg.Protect {
		host, port, err := net.SplitHostPort(a)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("%w: Protect %q: want host:port", ErrConfig, a)
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			ip = netip.IPv6Unspecified() // "" or a name: every local address
		}
		s.protect = append(s.protect, netip.AddrPortFrom(ip.Unmap(), uint16(n)))
	}
	s.cfg.Dial = s.guardDial(cfg.Dial)
	if cfg.ParkAfter > 0 {
		p, err := sharedParker()
		if err != nil {
			cfg.Logger.Warn("idle connections keep their goroutine", "err", err)
		}
		if p != nil {
			s.park, s.parkAfter = p, cfg.ParkAfter
		}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.bases = newBases(s.cfg.Dial)
	s.runner = cfg.Runner
	if s.runner == nil {
		s.runner = s.newRunner()
	}
	return s, nil
}

// Traces is the store of recent requests' traces.
func (s *Server) Traces() *Traces { return s.cfg.Traces }

// Policy is the server's source of policy.
func (s *Server) Policy() PolicySource { return s.cfg.Policy }

// Bulkheads is the registry of per-upstream bulkheads.
func (s *Server) Bulkheads() *Bulkheads { return s.cfg.Bulkheads }

// Serve accepts connections on l until Shutdown, then returns
// ErrServerClosed. l is closed when Serve returns.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
		l.Close()
		s.signal() // Shutdown counts the Serve loops left
	}()
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.closing.Load() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, errTooManyFiles) {
				s.cfg.Quota.fds.acceptFailed(err)
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.cfg.Logger.Warn("accept", "err", err, "retry_in", backoff)
				// A backoff, not a wait on an event: descriptors free up
				// anywhere in the process (or the system: ENFILE), and
				// nothing tells of it.
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		if kind, ok := s.cfg.Quota.takeConn(); !ok {
			// At its limit: the client's connect is refused (reset) now,
			// rather than kept waiting.
			s.refuseConn(nc, kind)
			continue
		}
		c := s.newConn(rawsock.Wrap(nc))
		if c == nil {
			continue
		}
		go c.serve()
	}
}

// Drain makes the server deny every retry from now on (the engine's
// runtime_draining). Requests still run their first attempt.
func (s *Server) Drain() { s.draining.Store(true) }

// Draining reports whether Drain or Shutdown was called.
func (s *Server) Draining() bool { return s.draining.Load() }

// CloseEndpoints closes the pooled upstream connections to addrs
// (host:port), busy ones when their exchange ends: endpoints that left
// their Kubernetes Service, whose connections must carry no other request.
func (s *Server) CloseEndpoints(addrs []string) {
	if len(addrs) > 0 && s.bases != nil {
		s.bases.closeAddrs(addrs)
	}
}

// Shutdown drains the server: it stops accepting, denies retries, closes
// idle keep-alive connections, lets in-flight requests, tunnels and
// passthrough connections finish until ctx ends, and returns ctx's error
// (nil when everything finished in time). Idle upstream connections are
// closed too.
//
// When ctx ends first, every request still in flight is told the truth
// before its connection goes: its attempts are cancelled and it is
// answered as any failed request is (503 not-sent when no byte of it can
// have reached the upstream, 502/504 failed or ambiguous otherwise, with
// Egret-Outcome and its log line); a request whose body was still being
// read from the client gets 503 not-sent, and so does one already in the
// socket of a connection not yet spoken on. Only a connection whose
// response body has begun (it cannot be answered again), a tunnel or a
// passthrough is cut at once, with a reset. The answers get up to
// AnswerGrace; what is left then is reset.
func (s *Server) Shutdown(ctx context.Context) error {
	s.Drain()
	s.closing.Store(true)
	s.mu.Lock()
	for l := range s.listeners {
		l.Close()
	}
	s.mu.Unlock()
	defer s.bases.closeIdle()
	// A connection accepted but not yet spoken on is a client about to
	// send its first request (it connected a moment ago, perhaps while
	// the listener closed): closing it would reset that request. It has
	// firstRequestGrace to begin one; an idle keep-alive connection is
	// closed at once, as a client of keep-alive expects.
	//
	// It waits on events: a connection that ends or changes state, a
	// Serve loop that ends (signal), the new connections' grace.
	newGrace := time.NewTimer(min(firstRequestGrace, s.cfg.ReadHeaderTimeout))
	defer newGrace.Stop()
	closeNew := false
	for {
		if s.closeIdleConns(closeNew) == 0 {
			return nil
		}
		// An ended grace comes first: a connection's change ready at
		// the same moment must not let Shutdown report success.
		if ctx.Err() != nil {
			s.cutInFlight()
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
			s.cutInFlight()
			return ctx.Err()
		case <-s.changed:
		case <-newGrace.C:
			closeNew = true
		}
	}
}

// cutInFlight ends what is left once Shutdown's grace is over: in-flight
// requests are answered (their attempts cancelled, reads from their
// clients interrupted), then what has not ended within AnswerGrace is
// closed.
func (s *Server) cutInFlight() {
	s.cut.Store(true)
	s.cancel()
	s.mu.Lock()
	var woken []*conn
	for c := range s.conns {
		switch {
		case c.state == stateTunnel, c.state == stateActive && c.bodyBegun.Load():
			// A response whose body has begun cannot be answered again,
			// and a tunnel or passthrough has no request egret could
			// answer: cut, with a reset, so that the client cannot take
			// what it got for the whole (a body that ends with the
			// connection would look complete).
			closeWithReset(c.c)
		case c.state == stateH2:
			// Its streams' reads from the client end now (their attempts
			// are cancelled above); each is answered as a request on
			// HTTP/1.1 is, and the connection ends after its GOAWAY.
			c.h2.interrupt()
		case c.state == stateActive, c.state == stateNew:
			// A read from the client (a request head or body) ends now;
			// the conn answers it 503 not-sent. The reader checks cut
			// after setting its own deadline, so this one is not lost.
			// A new connection's request already here is read and
			// answered so; with none, the connection just ends. A
			// parked one, resumed, reads what is there (cut is set).
			c.c.SetReadDeadline(aLongTimeAgo)
			woken = s.wake(woken, c)
		default:
			c.c.Close()
			woken = s.wake(woken, c)
		}
	}
	s.mu.Unlock()
	resumeAll(woken)
	timer := time.NewTimer(s.cfg.AnswerGrace)
	defer timer.Stop()
	for {
		s.mu.Lock()
		left := len(s.conns)
		if left == 0 {
			s.shut = true
		}
		s.mu.Unlock()
		if left == 0 {
			return
		}
		select {
		case <-s.changed:
		case <-timer.C:
			// Not answered in time: reset, never a clean end that could
			// pass for a complete answer.
			s.mu.Lock()
			s.shut = true
			woken = woken[:0]
			for c := range s.conns {
				closeWithReset(c.c)
				woken = s.wake(woken, c)
			}
			s.mu.Unlock()
			resumeAll(woken)
			return
		}
	}
}

// signal tells Shutdown and cutInFlight that a connection changed state or
// ended, or that a Serve loop ended.
func (s *Server) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// firstRequestGrace is how long Shutdown lets a new connection begin its
// first request (net/http's Shutdown waits as long for its new ones).
const firstRequestGrace = 5 * time.Second

// closeIdleConns closes the connections waiting for a next request, and the
// new ones too if closeNew, and returns how many connections are left open
// and Serve loops left running (a loop that accepted a connection has yet
// to register it). Once none is, the server takes no more (Shutdown has
// ended).
func (s *Server) closeIdleConns(closeNew bool) int {
	s.mu.Lock()
	var woken []*conn
	for c := range s.conns {
		switch {
		case c.state == stateH2 && !c.h2.goingAway:
			// No new stream; the connection ends once its streams are
			// answered.
			c.h2.goAway()
		case c.state == stateIdle || closeNew && c.state == stateNew:
			c.c.Close()
			woken = s.wake(woken, c)
		}
	}
	left := len(s.conns) + len(s.listeners)
	if left == 0 {
		s.shut = true
	}
	s.mu.Unlock()
	resumeAll(woken)
	return left
}

// wake takes c back from the parker if it is parked, adding it to woken:
// its goroutine is to be started again (resumeAll, once s.mu is released)
// to meet what was done to it as any waiting connection would (a read
// that fails on a closed socket, or past its deadline, then the end).
func (s *Server) wake(woken []*conn, c *conn) []*conn {
	if s.park.unpark(c) {
		woken = append(woken, c)
	}
	return woken
}

func resumeAll(woken []*conn) {
	for _, c := range woken {
		go c.resume()
	}
}

// parkedChanged counts a connection parked (1) or taken back (-1).
func (s *Server) parkedChanged(d int64) {
	s.parked.Add(d)
	if s.onPark != nil {
		s.onPark()
	}
}

// newConn registers nc. While the server closes it is still served (it
// was accepted before the listener closed, and its client has sent or is
// sending a request); once Shutdown has returned it is closed.
func (s *Server) newConn(nc net.Conn) *conn {
	c := &conn{s: s, c: nc, state: stateNew}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shut {
		nc.Close()
		s.cfg.Quota.putConn()
		return nil
	}
	s.conns[c] = struct{}{}
	s.cfg.Metrics.connOpened()
	s.signal()
	return c
}

func (s *Server) removeConn(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.cfg.Quota.putConn()
	s.cfg.Metrics.connClosed()
	s.signal()
}

// refuseConn resets a connection its tenant has no room for. The refusals
// are counted, and logged at 1, 2, 4, 8... of a kind: a pod that hammers
// its limit does not flood the log.
//
// The refusal is counted before the reset goes out: a client (or a test)
// that reads the count after its reset must find it there.
func (s *Server) refuseConn(nc net.Conn, kind int) {
	s.limitRefused(kind)
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	nc.Close()
}

func (s *Server) limitRefused(kind int) {
	n := s.cfg.Quota.refused[kind].Add(1)
	s.cfg.Metrics.limitRefused(kind)
	if n&(n-1) == 0 {
		s.cfg.Logger.Warn("tenant at its limit", "limit", limitLabels[kind], "refused", n,
			"limits", fmt.Sprintf("%+v", s.cfg.Quota.Limits()))
	}
}

// setState moves c to state; a kept connection becoming active again while
// the server closes is refused (false): Shutdown closes it. A new
// connection may begin its first request.
func (s *Server) setState(c *conn, st connState) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st != stateIdle && s.closing.Load() && c.state == stateIdle {
		return false
	}
	c.state = st
	s.signal()
	return true
}
