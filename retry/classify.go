package retry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"syscall"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/retry/client"
)

// classify maps a failed attempt to its failure category (spec section 2)
// from the error and how far the attempt got (a, its trace's progress).
// timedOut says the attempt's own timeout (or the overall deadline) fired.
func classify(a *attempt.Progress, err error, timedOut bool) (engine.Category, Stage) {
	c, st := classifyProgress(a, err, timedOut)
	// A connection of this attempt may have carried the request before
	// net/http moved to another one: never claim not_sent then.
	if c.Evidence() == engine.NotSent && a.MayHaveSent && c != engine.RefusedStream {
		return engine.ConnectionReset, StageHeaders
	}
	return c, st
}

func classifyProgress(a *attempt.Progress, err error, timedOut bool) (engine.Category, Stage) {
	var de *client.DialError
	if errors.As(err, &de) {
		if de.Op == "tls" {
			if isCertError(de.Err) {
				return engine.TLSCertificate, StageTLS
			}
			return engine.TLSHandshake, StageTLS
		}
		return dialCategory(de.Err, timedOut || a.ConnectStart && !a.ConnectDone && isTimeout(de.Err))
	}
	if client.StreamRefused(err) {
		// REFUSED_STREAM, above a GOAWAY's last stream, or on connections
		// that would open no new stream: the server never saw it.
		return engine.RefusedStream, StageHeaders
	}
	if a.GotConns == 0 {
		// No connection yet: nothing of the request was written.
		switch {
		case errors.Is(err, ErrRequestInvalid):
			return engine.RequestInvalid, StagePool
		case errors.Is(err, ErrProfileRejected):
			return engine.ProfileRejected, StageConnect
		case isCertError(err):
			return engine.TLSCertificate, StageTLS
		case a.TLSStart && (!a.TLSDone || a.TLSErr != nil):
			return engine.TLSHandshake, StageTLS
		}
		var dns *net.DNSError
		var op *net.OpError
		switch {
		case errors.As(err, &dns):
			return dnsCategory(dns), StageDNS
		case errors.As(err, &op) && op.Op == "dial":
			return dialCategory(err, timedOut)
		case timedOut && a.DNSStart && !a.DNSDone:
			return engine.DNSFailure, StageDNS
		case timedOut && a.ConnectStart && !a.ConnectDone:
			return engine.ConnectTimeout, StageConnect
		}
		// Waiting for a pooled connection, a bulkhead, or the caller gave
		// up before a connection existed.
		return engine.PoolTimeout, StagePool
	}
	switch {
	case timedOut && client.PeerReset(err):
		// The server's RST_STREAM or GOAWAY came back from RoundTrip,
		// and the timer fired before we looked: only the peer writes
		// those, so the peer ended the attempt, not our timer.
		return engine.ConnectionReset, StageHeaders
	case timedOut, errors.Is(err, attempt.ErrTimeout):
		// The attempt's timer or the deadline ended it before a final
		// response header: response_timeout, even when part of an answer
		// had come (an interim 1xx, the start of a head). net/http's HTTP/2 then
		// reports a bare context.Canceled, without the timer's cause.
		return engine.ResponseTimeout, StageHeaders
	case a.WriteErr != nil:
		return engine.WriteFailed, StageWrite
	case !a.WroteRequest:
		if a.WroteHeaders {
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
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, attempt.ErrTimeout) {
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
