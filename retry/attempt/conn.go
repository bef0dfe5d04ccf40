package attempt

import (
	"errors"
	"net"
	"reflect"
	"sync"
	"syscall"
	"time"

	"github.com/egret-proxy/egret/witness"
)

// ErrFrozen is returned by writes on a connection frozen for the witness.
var ErrFrozen = errors.New("connection frozen after a failure")

// Conn wraps an upstream TCP connection so that the kernel witness
// can prove that no byte of a failed attempt left the host.
//
// The proof needs the "after" snapshot to be taken at the failure, before
// anything else is written on the socket (a TLS close_notify would move the
// counters) and with nothing of the request left to leave later. So the
// connection freezes at its first read or write error, when the retry
// runner says so (attempt timeout), or at Close: from then on it refuses
// writes, it takes the final snapshot if no write is in flight, and if
// bytes are still queued in the socket it sets SO_LINGER 0 so that closing
// it discards them (RST) instead of sending them.
type Conn struct {
	net.Conn
	raw syscall.RawConn
	// shared: the connection multiplexes requests (HTTP/2); an attempt
	// must not freeze it for one stream (MarkShared).
	shared bool

	mu       sync.Mutex
	w        witness.Witness
	birth    witness.Counters // at dial (after the TLS handshake), when armed from birth
	hasBirth bool
	bornAt   uint64 // written when birth was taken
	written  uint64 // bytes the socket accepted from us
	writing  int
	// drained, when set, is closed by the write that brings writing to
	// zero: freeze waits on it for a write in flight.
	drained chan struct{}
	// fresh is a snapshot taken while nothing was in flight (at birth, or
	// by the pool's check of the idle connection), with the witness that
	// took it and written at that moment: the next request's "before"
	// when nothing was written since (see TakeFresh).
	fresh    witness.Counters
	freshW   witness.Witness
	freshAt  uint64
	hasFresh bool
	// read counts the bytes read from the socket. Only the goroutine
	// reading a response touches it, and the pool's check once the
	// connection is idle (the pool's lock orders the two).
	read   uint64
	frozen bool
	// handedOver: the connection switched protocols and carries no
	// attempt any more; it never freezes.
	handedOver bool
	final      witness.Counters
	finalOK    bool
	finalErr   error
}

func NewConn(c net.Conn) *Conn {
	wc := &Conn{Conn: c}
	if raw, err := RawConnOf(c); err == nil {
		wc.raw = raw
	}
	return wc
}

// Raw is the socket (nil when the connection has none).
func (c *Conn) Raw() syscall.RawConn { return c.raw }

// MarkShared says the connection carries several requests at once
// (HTTP/2): no attempt freezes it for itself. Call it before any attempt
// uses it.
func (c *Conn) MarkShared() { c.shared = true }

// SyscallConn exposes the socket to witnesses.
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	if c.raw == nil {
		return nil, witness.ErrUnsupported
	}
	return c.raw, nil
}

// NetConn returns the wrapped connection.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// Arm sets the witness used for the final snapshot.
func (c *Conn) Arm(w witness.Witness) {
	c.mu.Lock()
	c.w = w
	c.mu.Unlock()
}

// ArmAtBirth arms a new connection and takes its first snapshot, a valid
// "before" for a request that finds it already dead.
func (c *Conn) ArmAtBirth(w witness.Witness) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.w = w
	c.snapBirthLocked()
}

// Reborn retakes the birth snapshot once the TLS handshake is done: the
// handshake's own bytes are not the request's.
func (c *Conn) Reborn() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.snapBirthLocked()
}

func (c *Conn) snapBirthLocked() {
	c.hasBirth = false
	if c.w == nil || c.raw == nil || c.frozen || c.writing > 0 {
		return
	}
	if s, err := c.w.Snapshot(c.raw); err == nil {
		c.birth, c.hasBirth, c.bornAt = s, true, c.written
		c.fresh, c.freshW, c.freshAt, c.hasFresh = s, c.w, c.written, true
	}
}

// CheckIdle tells from a snapshot by the connection's witness whether an
// idle connection can no longer carry a request: the peer closed or reset
// it (its state is no longer established), or, unless pendingOK (TLS: a
// session ticket may wait), bytes wait that nobody asked for. decided is
// false when the snapshot cannot tell (no witness, counters missing, a
// failure other than a closed socket); the caller then peeks. The snapshot
// is kept as the next request's "before" (TakeFresh), so that a reused
// connection costs one system call, not a peek and a snapshot.
func (c *Conn) CheckIdle(pendingOK bool) (stale, decided bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hasFresh = false
	if c.w == nil || c.raw == nil || c.frozen || c.writing > 0 || !comparable(c.w) {
		return false, false
	}
	s, err := c.w.Snapshot(c.raw)
	if err != nil {
		return errors.Is(err, net.ErrClosed), errors.Is(err, net.ErrClosed)
	}
	c.fresh, c.freshW, c.freshAt, c.hasFresh = s, c.w, c.written, true
	switch {
	case s.State == 0:
		return false, false
	case s.State != witness.StateEstablished:
		return true, true
	case pendingOK:
		return false, true
	case !s.HasBytesReceived:
		return false, false
	}
	return s.BytesReceived != c.read, true
}

// TakeFresh returns the fresh snapshot if w took it and nothing was
// written on the connection since, and forgets it either way: a snapshot
// taken earlier than the request's start is as good a "before" as one
// taken at it, since the counters only grow (anything the kernel sent
// between the two, a retransmission, can only void a proof, never make
// one).
func (c *Conn) TakeFresh(w witness.Witness) (witness.Counters, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok := c.hasFresh && c.freshAt == c.written && c.writing == 0 && !c.frozen &&
		comparable(w) && c.freshW == w
	c.hasFresh = false
	return c.fresh, ok
}

// comparable reports whether w can be compared with ==; a witness of a
// type that cannot never reuses a snapshot.
func comparable(w witness.Witness) bool {
	t := reflect.TypeOf(w)
	return t != nil && t.Comparable()
}

// birthIfUnused returns the birth snapshot if nothing was written on the
// connection since: then it is as good a "before" as one taken now.
func (c *Conn) birthIfUnused() (witness.Counters, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.birth, c.hasBirth && c.written == c.bornAt && c.writing == 0
}

// bytesWritten is how many bytes the socket accepted from us so far.
func (c *Conn) bytesWritten() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.written
}

func (c *Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.frozen {
		c.mu.Unlock()
		return 0, ErrFrozen
	}
	c.writing++
	c.mu.Unlock()
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	c.writing--
	c.written += uint64(max(n, 0))
	if c.writing == 0 && c.drained != nil {
		close(c.drained)
		c.drained = nil
	}
	c.mu.Unlock()
	if err != nil {
		c.freeze()
	}
	return n, err
}

func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read += uint64(max(n, 0))
	if err != nil {
		c.freeze()
	}
	return n, err
}

// Close freezes the connection (taking the final snapshot) and closes it.
func (c *Conn) Close() error {
	c.freeze()
	return c.Conn.Close()
}

// freezeWait bounds how long freeze waits for a write in flight to return.
const freezeWait = 100 * time.Millisecond

// freeze stops all writes (they fail with ErrFrozen) and takes the final
// snapshot once.
func (c *Conn) freeze() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen || c.handedOver {
		return
	}
	c.frozen = true
	if c.w == nil || c.raw == nil {
		return
	}
	// A write already inside the kernel may still queue bytes: wait for
	// it to return (the connection is failing, so it will soon) before
	// reading the counters. New writes are refused from now on. The wait
	// is bounded: a write blocked on a full send buffer of a peer that
	// reads nothing returns only once the connection is closed, which may
	// be what the caller of this freeze is about to do; past the bound the
	// snapshot is given up (finalErr), never guessed.
	if c.writing > 0 {
		done := make(chan struct{})
		c.drained = done
		c.mu.Unlock()
		t := time.NewTimer(freezeWait)
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
		c.mu.Lock()
	}
	if c.writing > 0 {
		c.finalErr = errors.New("write in flight at the failure")
		return
	}
	snap, err := c.w.Snapshot(c.raw)
	if err != nil {
		c.finalErr = err
		return
	}
	if snap.HasNotSentBytes && snap.NotSentBytes > 0 {
		if l := lingererOf(c.Conn); l != nil && l.SetLinger(0) == nil {
			snap.QueueDiscarded = true
		}
	}
	c.final, c.finalOK = snap, true
}

// HandOver ends the witness's watch of a connection that switched
// protocols (a 101): it carries no attempt any more, and freezing it
// (writes refused after a read's end, queued bytes reset at its close)
// would break the new protocol.
func (c *Conn) HandOver() {
	c.mu.Lock()
	c.handedOver = true
	c.mu.Unlock()
}

// finalSnapshot returns the snapshot taken when the connection froze.
func (c *Conn) finalSnapshot() (witness.Counters, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.final, c.finalOK
}

// under finds the first connection that is a T in c's chain of wrappers:
// c itself, then what its NetConn method returns (*tls.Conn and
// Conn have one), at most four deep.
func under[T any](c net.Conn) (T, bool) {
	for range 4 {
		if t, ok := c.(T); ok {
			return t, true
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	var zero T
	return zero, false
}

// ConnOf finds the Conn under c (through *tls.Conn).
func ConnOf(c net.Conn) *Conn {
	wc, _ := under[*Conn](c)
	return wc
}

// RawConnOf returns the socket under c, unwrapping *tls.Conn and any
// connection with a NetConn method.
func RawConnOf(c net.Conn) (syscall.RawConn, error) {
	if sc, ok := under[syscall.Conn](c); ok {
		return sc.SyscallConn()
	}
	return nil, witness.ErrUnsupported
}

// lingererOf finds the connection under c that can set SO_LINGER.
func lingererOf(c net.Conn) interface{ SetLinger(int) error } {
	l, _ := under[interface{ SetLinger(int) error }](c)
	return l
}
