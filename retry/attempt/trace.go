package attempt

import (
	"crypto/tls"
	"net"
	"net/http/httptrace"
	"sync"
	"syscall"
	"time"

	"github.com/egret-proxy/egret/witness"
)

// Trace records one attempt's progress: the client reports to it directly
// (GotConn, WroteHeaders, WroteRequest, SetIdleBound, PeerEnded), and any
// other code through the httptrace hooks of ClientTrace. Its hooks may run
// on net/http's goroutines, hence the lock. The runner reads what it
// recorded with Progress, and the witness's "After" with After.
type Trace struct {
	// Witness and Risky are set by the runner before the attempt starts
	// and not changed afterwards. Witness takes the socket's snapshots
	// (nil: none); Risky says the request is not safely idempotent: the
	// HTTP/1.1 pool then gives it only a connection within bound.
	Witness witness.Witness
	Risky   bool

	mu                        sync.Mutex
	dnsStart, dnsDone         bool
	connectStart, connectDone bool
	tlsStart, tlsDone         bool
	tlsErr                    error
	gotConns                  int
	hidden                    int // connections switched to After a write on the previous one
	conn                      net.Conn
	// connWC is conn's witnessConn when the request has it to itself
	// (nil otherwise: HTTP/2 carries other streams' bytes too) and
	// connWritten its byte count when the request got the connection.
	connWC       *Conn
	connWritten  uint64
	wroteHeaders bool
	wroteRequest bool
	writeErr     error
	// mayHaveSent: some connection of this attempt (net/http may have
	// retried on its own) got as far as writing the request.
	mayHaveSent bool
	before      witness.Counters
	hasBefore   bool
	bound       IdleBound
	// reused, idle: the connection had carried requests, and was idle
	// that long when this attempt took it.
	reused bool
	idle   time.Duration
	// endBeforeAnswer: the upstream ended the stream (FIN, read as the end
	// of a plain TCP connection) before any byte of a response.
	endBeforeAnswer bool
}

// SetIdleBound records the idle bound the pool applied to the attempt.
func (a *Trace) SetIdleBound(b IdleBound) {
	a.mu.Lock()
	a.bound = b
	a.mu.Unlock()
}

// PeerEnded records that the upstream's FIN came before any response byte.
func (a *Trace) PeerEnded() {
	a.mu.Lock()
	a.endBeforeAnswer = true
	a.mu.Unlock()
}

// ClientTrace gives the attempt's hooks to net/http/httptrace, for the
// code that reports through it only: a Base other than HTTPTransport,
// dialers, HTTP/2.
func (a *Trace) ClientTrace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		DNSStart: func(httptrace.DNSStartInfo) { a.mu.Lock(); a.dnsStart = true; a.mu.Unlock() },
		DNSDone:  func(httptrace.DNSDoneInfo) { a.mu.Lock(); a.dnsDone = true; a.mu.Unlock() },
		ConnectStart: func(string, string) {
			a.mu.Lock()
			a.connectStart = true
			a.mu.Unlock()
		},
		ConnectDone: func(_, _ string, err error) {
			a.mu.Lock()
			if err == nil {
				a.connectDone = true
			}
			a.mu.Unlock()
		},
		TLSHandshakeStart: func() { a.mu.Lock(); a.tlsStart = true; a.mu.Unlock() },
		TLSHandshakeDone: func(_ tls.ConnectionState, err error) {
			a.mu.Lock()
			a.tlsDone, a.tlsErr = true, err
			a.mu.Unlock()
		},
		GotConn:      a.GotConn,
		WroteHeaders: a.WroteHeaders,
		WroteRequest: a.WroteRequest,
	}
}

func (a *Trace) WroteHeaders() {
	a.mu.Lock()
	a.wroteHeaders, a.mayHaveSent = true, true
	a.mu.Unlock()
}

// GotConn takes the witness's "before" snapshot: the request write starts
// on this connection now.
func (a *Trace) GotConn(info httptrace.GotConnInfo) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gotConns > 0 {
		if a.wroteOnPrevLocked() {
			// Something of the request went to the previous connection.
			a.hidden++
		}
		// Only a connection that took bytes of the request may have
		// carried it.
		a.mayHaveSent = a.hidden > 0
	}
	a.gotConns++
	a.conn = info.Conn
	a.reused, a.idle, a.endBeforeAnswer = info.Reused, info.IdleTime, false
	a.connWC, a.connWritten = nil, 0
	if wc := ConnOf(info.Conn); wc != nil && !wc.shared {
		a.connWC, a.connWritten = wc, wc.bytesWritten()
	}
	a.wroteHeaders, a.wroteRequest, a.writeErr = false, false, nil
	a.hasBefore = false
	if a.Witness == nil || info.Conn == nil {
		return
	}
	wc := ConnOf(info.Conn)
	if wc != nil {
		wc.Arm(a.Witness)
	}
	var err error
	if b, ok := wcFresh(wc, a.Witness); ok {
		// Taken by the pool's check a moment ago, or at the dial.
		a.before = b
	} else {
		var raw syscall.RawConn
		if raw, err = RawConnOf(info.Conn); err == nil {
			a.before, err = a.Witness.Snapshot(raw)
		}
	}
	if err != nil && wc != nil {
		// Already dead (and closed) before the request reached it: if
		// nothing was ever written on it, its birth snapshot stands.
		if b, ok := wc.birthIfUnused(); ok {
			a.before, err = b, nil
		}
	}
	a.hasBefore = err == nil
}

func wcFresh(wc *Conn, w witness.Witness) (witness.Counters, bool) {
	if wc == nil || wc.shared {
		return witness.Counters{}, false
	}
	return wc.TakeFresh(w)
}

// wroteOnPrevLocked reports whether the connection net/http is moving away
// from took bytes of the request. The trace's WroteHeaders and WroteRequest
// fire once the request is in net/http's buffer, before it is flushed: a
// write that fails on a connection the upstream already reset (net/http
// then replays the request on a new one, "nothing written") fires them
// too. The socket's own count tells; a connection that is not ours (a Base
// other than HTTPTransport) or is shared has none, and the trace's word
// stands.
func (a *Trace) wroteOnPrevLocked() bool {
	if a.connWC != nil {
		return a.connWC.bytesWritten() != a.connWritten
	}
	return a.wroteHeaders || a.wroteRequest
}

func (a *Trace) WroteRequest(info httptrace.WroteRequestInfo) {
	a.mu.Lock()
	a.wroteRequest, a.writeErr, a.mayHaveSent = true, info.Err, true
	a.mu.Unlock()
}

// FreezeConn freezes the attempt's connection for the witness when it is
// not shared with other requests (an attempt timeout on HTTP/1.1).
func (a *Trace) FreezeConn() {
	a.mu.Lock()
	c := a.conn
	a.mu.Unlock()
	if c == nil {
		return
	}
	if wc := ConnOf(c); wc != nil && !wc.shared {
		wc.freeze()
	}
}

// After returns the witness's "after" snapshot of a failed attempt: the one
// its connection took when it froze. A connection that is not ours (a Base
// other than HTTPTransport) gives none: nothing stops a write still in
// flight from queueing bytes After any reading we could take, so there is
// no proof to be had.
func (a *Trace) After() (witness.Counters, bool) {
	a.mu.Lock()
	c := a.conn
	a.mu.Unlock()
	if c == nil || a.Witness == nil {
		return witness.Counters{}, false
	}
	wc := ConnOf(c)
	if wc == nil {
		return witness.Counters{}, false
	}
	if !wc.shared {
		wc.freeze()
	}
	return wc.finalSnapshot()
}

// Progress is what a Trace recorded, read at once (Trace.Progress): how
// far the attempt got, on which connection, and the witness's "before".
type Progress struct {
	DNSStart, DNSDone         bool
	ConnectStart, ConnectDone bool
	TLSStart, TLSDone         bool
	TLSErr                    error
	// GotConns counts the connections the attempt was given; Hidden those
	// switched to after a write on the previous one (net/http's own
	// replays).
	GotConns int
	Hidden   int
	// WroteHeaders, WroteRequest and WriteErr are the request write's
	// progress on the last connection.
	WroteHeaders bool
	WroteRequest bool
	WriteErr     error
	// MayHaveSent: some connection of this attempt got as far as writing
	// the request.
	MayHaveSent bool
	// Before is the witness's snapshot when the request write started
	// (HasBefore: one was taken).
	Before    witness.Counters
	HasBefore bool
	// Bound is the idle bound the pool applied; Reused and Idle say the
	// connection had carried requests and was idle that long.
	Bound  IdleBound
	Reused bool
	Idle   time.Duration
	// EndBeforeAnswer: the upstream ended the stream (FIN) before any
	// byte of a response.
	EndBeforeAnswer bool
}

// Progress returns what the trace recorded so far.
func (a *Trace) Progress() Progress {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Progress{
		DNSStart: a.dnsStart, DNSDone: a.dnsDone,
		ConnectStart: a.connectStart, ConnectDone: a.connectDone,
		TLSStart: a.tlsStart, TLSDone: a.tlsDone, TLSErr: a.tlsErr,
		GotConns: a.gotConns, Hidden: a.hidden,
		WroteHeaders: a.wroteHeaders, WroteRequest: a.wroteRequest, WriteErr: a.writeErr,
		MayHaveSent: a.mayHaveSent,
		Before:      a.before, HasBefore: a.hasBefore,
		Bound: a.bound, Reused: a.reused, Idle: a.idle,
		EndBeforeAnswer: a.endBeforeAnswer,
	}
}
