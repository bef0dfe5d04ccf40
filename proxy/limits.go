package proxy

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
)

// Limits bound what one tenant — a pod, in the node agent — may hold of
// the proxy at once. A zero field is no limit; the node agent gives every
// pod limits (WithDefaults fills in the defaults).
type Limits struct {
	// Conns is the client connections open at once. One more is refused
	// at once: its client sees a refused (reset) connect.
	Conns int `json:"connections"`
	// InFlight is the requests being served at once. One more is
	// answered 503, Egret-Outcome: not-sent.
	InFlight int `json:"in_flight"`
	// SpoolBytes is the request-body bytes held at once, in memory and in
	// spool files, for replays. A body that would pass it is answered
	// 503, Egret-Outcome: not-sent (as is one that would need a spool
	// file when the process is out of descriptors).
	SpoolBytes int64 `json:"spool_bytes"`
}

// Defaults of Limits. The node agent also bounds a pod's default Conns by
// a share of the process's descriptors (see FDs.FairShare).
const (
	DefaultConnLimit       = 1024
	DefaultInFlightLimit   = 256
	DefaultSpoolBytesLimit = 64 << 20
)

// WithDefaults returns l with its zero fields set to the defaults.
func (l Limits) WithDefaults() Limits {
	if l.Conns <= 0 {
		l.Conns = DefaultConnLimit
	}
	if l.InFlight <= 0 {
		l.InFlight = DefaultInFlightLimit
	}
	if l.SpoolBytes <= 0 {
		l.SpoolBytes = DefaultSpoolBytesLimit
	}
	return l
}

// Errors of a Quota; match them with errors.Is.
var (
	// ErrLimit: the tenant is at one of its Limits.
	ErrLimit = errors.New("tenant at its limit")
	// ErrNoDescriptors: the process is out of the descriptors it lets
	// tenants take (FDs).
	ErrNoDescriptors = errors.New("out of descriptors for tenants")
)

// Quota is one tenant's account against its Limits and the node's
// descriptors. It is a small explicit object: the Server takes a
// connection's share when it accepts it, and a request's (its slot and the
// bytes of its body) while the request is served, and hands nothing of it
// through contexts. The node agent makes one per pod (all sharing one FDs);
// SetLimits changes the limits in place.
type Quota struct {
	conns, inFlight int64 // limits, atomically replaced by SetLimits
	spoolLimit      int64
	fds             *FDs

	nConns, nInFlight, nSpool atomic.Int64
	// refused counts refusals by limit, for the tenant's status.
	refused [nLimitKinds]atomic.Uint64
}

// Limit kinds, the limit label of egret_proxy_limit_refusals_total.
const (
	limitConns = iota
	limitInFlight
	limitSpool
	limitDescriptors
	nLimitKinds
)

var limitLabels = [nLimitKinds]string{"connections", "in_flight", "spool_bytes", "descriptors"}

// NewQuota returns a quota of lim (zero fields: no limit) drawing
// descriptors from fds (nil: none counted).
func NewQuota(lim Limits, fds *FDs) *Quota {
	q := &Quota{fds: fds}
	q.SetLimits(lim)
	return q
}

// SetLimits replaces the limits (zero fields: no limit). What is held
// beyond new, lower limits stays until it is given back.
func (q *Quota) SetLimits(lim Limits) {
	atomic.StoreInt64(&q.conns, int64(lim.Conns))
	atomic.StoreInt64(&q.inFlight, int64(lim.InFlight))
	atomic.StoreInt64(&q.spoolLimit, lim.SpoolBytes)
}

// Limits returns the limits in force.
func (q *Quota) Limits() Limits {
	return Limits{Conns: int(atomic.LoadInt64(&q.conns)), InFlight: int(atomic.LoadInt64(&q.inFlight)),
		SpoolBytes: atomic.LoadInt64(&q.spoolLimit)}
}

// Usage is what a tenant holds now and how often it was refused.
type Usage struct {
	Conns      int64             `json:"connections"`
	InFlight   int64             `json:"in_flight"`
	SpoolBytes int64             `json:"spool_bytes"`
	Refused    map[string]uint64 `json:"refused,omitempty"`
}

// Usage returns what the tenant holds now and its refusals so far.
func (q *Quota) Usage() Usage {
	u := Usage{Conns: q.nConns.Load(), InFlight: q.nInFlight.Load(), SpoolBytes: q.nSpool.Load()}
	for i := range q.refused {
		if n := q.refused[i].Load(); n > 0 {
			if u.Refused == nil {
				u.Refused = map[string]uint64{}
			}
			u.Refused[limitLabels[i]] = n
		}
	}
	return u
}

// fdsPerConn is what a client connection may hold: its own socket and one
// to its upstream (or its passthrough destination).
const fdsPerConn = 2

// takeConn takes a connection's share, or says which limit refuses it.
func (q *Quota) takeConn() (kind int, ok bool) {
	if n, lim := q.nConns.Add(1), atomic.LoadInt64(&q.conns); lim > 0 && n > lim {
		q.nConns.Add(-1)
		return limitConns, false
	}
	if !q.fds.take(fdsPerConn) {
		q.nConns.Add(-1)
		return limitDescriptors, false
	}
	return 0, true
}

func (q *Quota) putConn() {
	q.nConns.Add(-1)
	q.fds.put(fdsPerConn)
}

func (q *Quota) takeRequest() bool {
	if n, lim := q.nInFlight.Add(1), atomic.LoadInt64(&q.inFlight); lim > 0 && n > lim {
		q.nInFlight.Add(-1)
		return false
	}
	return true
}

func (q *Quota) putRequest() { q.nInFlight.Add(-1) }

func (q *Quota) takeSpool(n int64) bool {
	if held, lim := q.nSpool.Add(n), atomic.LoadInt64(&q.spoolLimit); lim > 0 && held > lim {
		q.nSpool.Add(-n)
		return false
	}
	return true
}

func (q *Quota) putSpool(n int64) { q.nSpool.Add(-n) }

// takeSpoolFile takes the descriptor of a body's spool file.
func (q *Quota) takeSpoolFile() bool { return q.fds.take(1) }

// spoolHold is what one request body holds of its quota.
type spoolHold struct {
	bytes int64
	file  bool // a descriptor for a spool file
}

func (q *Quota) putHold(h spoolHold) {
	q.putSpool(h.bytes)
	if h.file {
		q.fds.put(1)
	}
}

// errSpoolLimit ends the read of a body that would pass the spool limit;
// errNoSpoolFile refuses a body that may need a spool file when there is
// no descriptor for it.
var (
	errSpoolLimit  = fmt.Errorf("%w: spool bytes", ErrLimit)
	errNoSpoolFile = fmt.Errorf("%w: a spool file", ErrNoDescriptors)
)

// spoolCharge reads a body of unknown length into the spool, taking each
// byte read from the tenant's spool bytes until stop: what spool.New reads
// is what it holds. held is what was taken, given back with the body.
type spoolCharge struct {
	r    io.Reader
	q    *Quota
	held int64
	stop bool
}

func (c *spoolCharge) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 && !c.stop {
		if !c.q.takeSpool(int64(n)) {
			return 0, errSpoolLimit
		}
		c.held += int64(n)
	}
	return n, err
}

// FDs is the node's account of file descriptors: the soft RLIMIT_NOFILE
// less a reserve that egret keeps for itself (its listeners, upstream
// pools, spool files, the admin socket, metrics, policy reloads). Every
// tenant's connections draw from it (two each: the client's and its
// upstream's; a request body that may go to a spool file one more). When it
// runs out a new connection is refused at once rather
// than left to wait in an accept queue, and Exhausted says so; the node
// agent then stops redirecting pods to egret (their new connects go direct)
// until Changed says it has room again.
type FDs struct {
	capacity int64
	used     atomic.Int64

	mu        sync.Mutex
	exhausted bool
	changed   chan struct{}
}

// DefaultFDReserve is the descriptors egret keeps for itself by default:
// this many, or an eighth of the limit if more. The node agent itself holds
// about 60 (eBPF maps, programs and links, its sockets), a few more per pod
// (its namespace, its two listeners), and idle upstream connections.
const DefaultFDReserve = 128

// NewFDs returns the account of a process whose descriptor limit is limit,
// keeping reserve of them (DefaultFDReserve or an eighth of limit if
// reserve <= 0) out of the tenants' reach.
func NewFDs(limit, reserve int) *FDs {
	if reserve <= 0 {
		reserve = max(DefaultFDReserve, limit/8)
	}
	return &FDs{capacity: int64(max(limit-reserve, fdsPerConn)), changed: make(chan struct{}, 1)}
}

// Capacity is the descriptors tenants may hold.
func (f *FDs) Capacity() int { return int(f.capacity) }

// Used is the descriptors tenants hold now.
func (f *FDs) Used() int { return int(f.used.Load()) }

// FairShare is the default connection limit of a tenant: a quarter of the
// connections the descriptors allow, at most DefaultConnLimit, so that no
// one pod's connections can take every descriptor.
func (f *FDs) FairShare() int {
	if f == nil {
		return DefaultConnLimit
	}
	return max(1, min(DefaultConnLimit, int(f.capacity)/fdsPerConn/4))
}

// Exhausted reports whether the last connection asked for was refused for
// want of descriptors (or accept failed with EMFILE) and none has been
// given back since.
func (f *FDs) Exhausted() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.exhausted
}

// Changed is signalled when Exhausted changes.
func (f *FDs) Changed() <-chan struct{} { return f.changed }

func (f *FDs) take(n int64) bool {
	if f == nil {
		return true
	}
	if f.used.Add(n) > f.capacity {
		f.used.Add(-n)
		f.setExhausted(true)
		return false
	}
	return true
}

func (f *FDs) put(n int64) {
	if f == nil {
		return
	}
	f.used.Add(-n)
	// Room again once a tenth of the capacity (two connections at
	// least) is free: no flapping at the edge.
	if f.used.Load() <= f.capacity-max(f.capacity/10, 2*fdsPerConn) {
		f.setExhausted(false)
	}
}

// acceptFailed records an accept that failed for want of descriptors the
// account does not know of (EMFILE, ENFILE).
func (f *FDs) acceptFailed(err error) {
	if f != nil && (errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)) {
		f.setExhausted(true)
	}
}

func (f *FDs) setExhausted(v bool) {
	f.mu.Lock()
	changed := f.exhausted != v
	f.exhausted = v
	f.mu.Unlock()
	if changed {
		select {
		case f.changed <- struct{}{}:
		default:
		}
	}
}
