package retry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http/httptrace"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/witness"
)

// errAttemptTimeout is the cause of an attempt's context when its
// per-attempt timeout fired.
var errAttemptTimeout = errors.New("attempt timeout")

// attemptTrace follows one attempt through httptrace. Its hooks may run on
// net/http's goroutines, hence the lock.
type attemptTrace struct {
	w witness.Witness

	mu                        sync.Mutex
	dnsStart, dnsDone         bool
	connectStart, connectDone bool
	tlsStart, tlsDone         bool
	tlsErr                    error
	gotConns                  int
	hidden                    int // connections switched to after a write on the previous one
	conn                      net.Conn
	// connWC is conn's witnessConn when the request has it to itself
	// (nil otherwise: HTTP/2 carries other streams' bytes too) and
	// connWritten its byte count when the request got the connection.
	connWC       *witnessConn
	connWritten  uint64
	wroteHeaders bool
	wroteRequest bool
	writeErr     error
	// mayHaveSent: some connection of this attempt (net/http may have
	// retried on its own) got as far as writing the request.
	mayHaveSent bool
	before      witness.Counters
	hasBefore   bool
	// risky: the request is not safely idempotent (set by the runner); the
	// HTTP/1.1 pool then gives it only a connection within bound.
	risky bool
	bound IdleBound
	// reused, idle: the connection had carried requests, and was idle
	// that long when this attempt took it.
	reused bool
	idle   time.Duration
	// endBeforeAnswer: the upstream ended the stream (FIN, read as the end
	// of a plain TCP connection) before any byte of a response.
	endBeforeAnswer bool
}

// setIdleBound records the idle bound the pool applied to the attempt.
func (a *attemptTrace) setIdleBound(b IdleBound) {
	a.mu.Lock()
	a.bound = b
	a.mu.Unlock()
}

// peerEnded records that the upstream's FIN came before any response byte.
func (a *attemptTrace) peerEnded() {
	a.mu.Lock()
	a.endBeforeAnswer = true
	a.mu.Unlock()
}

// clientTrace gives the attempt's hooks to net/http/httptrace, for the
// code that reports through it only: a Base other than HTTPTransport,
// dialers, HTTP/2.
func (a *attemptTrace) clientTrace() *httptrace.ClientTrace {
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
		GotConn:      a.gotConn,
		WroteHeaders: a.wroteHeadersHook,
		WroteRequest: a.wroteReq,
	}
}

func (a *attemptTrace) wroteHeadersHook() {
	a.mu.Lock()
	a.wroteHeaders, a.mayHaveSent = true, true
	a.mu.Unlock()
}

// gotConn takes the witness's "before" snapshot: the request write starts
// on this connection now.
func (a *attemptTrace) gotConn(info httptrace.GotConnInfo) {
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
	if wc := witnessConnOf(info.Conn); wc != nil && !wc.shared {
		a.connWC, a.connWritten = wc, wc.bytesWritten()
	}
	a.wroteHeaders, a.wroteRequest, a.writeErr = false, false, nil
	a.hasBefore = false
	if a.w == nil || info.Conn == nil {
		return
	}
	wc := witnessConnOf(info.Conn)
	if wc != nil {
		wc.arm(a.w)
	}
	var err error
	if b, ok := wcFresh(wc, a.w); ok {
		// Taken by the pool's check a moment ago, or at the dial.
		a.before = b
	} else {
		var raw syscall.RawConn
		if raw, err = rawConnOf(info.Conn); err == nil {
			a.before, err = a.w.Snapshot(raw)
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

func wcFresh(wc *witnessConn, w witness.Witness) (witness.Counters, bool) {
	if wc == nil || wc.shared {
		return witness.Counters{}, false
	}
	return wc.takeFresh(w)
}

// wroteOnPrevLocked reports whether the connection net/http is moving away
// from took bytes of the request. The trace's WroteHeaders and WroteRequest
// fire once the request is in net/http's buffer, before it is flushed: a
// write that fails on a connection the upstream already reset (net/http
// then replays the request on a new one, "nothing written") fires them
// too. The socket's own count tells; a connection that is not ours (a Base
// other than HTTPTransport) or is shared has none, and the trace's word
// stands.
func (a *attemptTrace) wroteOnPrevLocked() bool {
	if a.connWC != nil {
		return a.connWC.bytesWritten() != a.connWritten
	}
	return a.wroteHeaders || a.wroteRequest
}

func (a *attemptTrace) wroteReq(info httptrace.WroteRequestInfo) {
	a.mu.Lock()
	a.wroteRequest, a.writeErr, a.mayHaveSent = true, info.Err, true
	a.mu.Unlock()
}

// freezeConn freezes the attempt's connection for the witness when it is
// not shared with other requests (an attempt timeout on HTTP/1.1).
func (a *attemptTrace) freezeConn() {
	a.mu.Lock()
	c := a.conn
	a.mu.Unlock()
	if c == nil {
		return
	}
	if wc := witnessConnOf(c); wc != nil && !wc.shared {
		wc.freeze()
	}
}

// after returns the witness's "after" snapshot of a failed attempt: the one
// its connection took when it froze. A connection that is not ours (a Base
// other than HTTPTransport) gives none: nothing stops a write still in
// flight from queueing bytes after any reading we could take, so there is
// no proof to be had.
func (a *attemptTrace) after() (witness.Counters, bool) {
	a.mu.Lock()
	c := a.conn
	a.mu.Unlock()
	if c == nil || a.w == nil {
		return witness.Counters{}, false
	}
	wc := witnessConnOf(c)
	if wc == nil {
		return witness.Counters{}, false
	}
	if !wc.shared {
		wc.freeze()
	}
	return wc.finalSnapshot()
}

// classify maps a failed attempt to its failure category (spec section 2)
// from the error and how far the trace got. timedOut says the attempt's own
// timeout (or the overall deadline) fired.
func (a *attemptTrace) classify(err error, timedOut bool) (engine.Category, Stage) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, st := a.classifyLocked(err, timedOut)
	// A connection of this attempt may have carried the request before
	// net/http moved to another one: never claim not_sent then.
	if c.Evidence() == engine.NotSent && a.mayHaveSent && c != engine.RefusedStream {
		return engine.ConnectionReset, StageHeaders
	}
	return c, st
}

func (a *attemptTrace) classifyLocked(err error, timedOut bool) (engine.Category, Stage) {
	var de *DialError
	if errors.As(err, &de) {
		if de.Op == "tls" {
			if isCertError(de.Err) {
				return engine.TLSCertificate, StageTLS
			}
			return engine.TLSHandshake, StageTLS
		}
		return dialCategory(de.Err, timedOut || a.connectStart && !a.connectDone && isTimeout(de.Err))
	}
	if h2Refused(err) {
		// REFUSED_STREAM, above a GOAWAY's last stream, or on connections
		// that would open no new stream: the server never saw it.
		return engine.RefusedStream, StageHeaders
	}
	if a.gotConns == 0 {
		// No connection yet: nothing of the request was written.
		switch {
		case errors.Is(err, ErrRequestInvalid):
			return engine.RequestInvalid, StagePool
		case errors.Is(err, ErrProfileRejected):
			return engine.ProfileRejected, StageConnect
		case isCertError(err):
			return engine.TLSCertificate, StageTLS
		case a.tlsStart && (!a.tlsDone || a.tlsErr != nil):
			return engine.TLSHandshake, StageTLS
		}
		var dns *net.DNSError
		var op *net.OpError
		switch {
		case errors.As(err, &dns):
			return dnsCategory(dns), StageDNS
		case errors.As(err, &op) && op.Op == "dial":
			return dialCategory(err, timedOut)
		case timedOut && a.dnsStart && !a.dnsDone:
			return engine.DNSFailure, StageDNS
		case timedOut && a.connectStart && !a.connectDone:
			return engine.ConnectTimeout, StageConnect
		}
		// Waiting for a pooled connection, a bulkhead, or the caller gave
		// up before a connection existed.
		return engine.PoolTimeout, StagePool
	}
	switch {
	case timedOut && peerReset(err):
		// The server's RST_STREAM or GOAWAY came back from RoundTrip,
		// and the timer fired before we looked: only the peer writes
		// those, so the peer ended the attempt, not our timer.
		return engine.ConnectionReset, StageHeaders
	case timedOut, errors.Is(err, errAttemptTimeout):
		// The attempt's timer or the deadline ended it before a final
		// response header: response_timeout, even when part of an answer
		// had come (an interim 1xx, the start of a head). net/http's HTTP/2 then
		// reports a bare context.Canceled, without the timer's cause.
		return engine.ResponseTimeout, StageHeaders
	case a.writeErr != nil:
		return engine.WriteFailed, StageWrite
	case !a.wroteRequest:
		if a.wroteHeaders {
			return engine.WriteFailed, StageWrite
		}
		return engine.ConnectionReset, StageWrite
	}
	return engine.ConnectionReset, StageHeaders
}

func dialCategory(err error, timedOut bool) (engine.Category, Stage) {
	if errors.Is(err, ErrProfileRejected) {
		return engine.ProfileRejected, StageConnect
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return dnsCategory(dns), StageDNS
	}
	if timedOut || isTimeout(err) {
		return engine.ConnectTimeout, StageConnect
	}
	// Refused, unreachable, reset during the handshake: the connection
	// never existed, so no byte of a request was written.
	return engine.ConnectRefused, StageConnect
}

func dnsCategory(e *net.DNSError) engine.Category {
	if e.IsNotFound {
		return engine.DNSNotFound
	}
	return engine.DNSFailure
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, errAttemptTimeout) {
		return true
	}
	if errors.Is(err, syscall.ETIMEDOUT) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isCertError(err error) bool {
	var (
		cv *tls.CertificateVerificationError
		ua x509.UnknownAuthorityError
		he x509.HostnameError
		ci x509.CertificateInvalidError
		ce x509.ConstraintViolationError
	)
	return errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &he) ||
		errors.As(err, &ci) || errors.As(err, &ce)
}
