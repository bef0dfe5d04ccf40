package engine

import "time"

// Outcome is what the caller is told when the engine stops without a
// response to relay (spec section 6).
type Outcome uint8

const (
	// OutcomeNone: a response is relayed as it is.
	OutcomeNone Outcome = iota
	// OutcomeNotSent: every attempt ended not_sent (503).
	OutcomeNotSent
	// OutcomeFailed: the request may have reached the server and retrying
	// could not help (502, 504 for a timeout).
	OutcomeFailed
	// OutcomeAmbiguous: a non-idempotent request may or may not have run
	// (502, 504 for a timeout).
	OutcomeAmbiguous
)

func (o Outcome) String() string {
	switch o {
	case OutcomeNotSent:
		return "not-sent"
	case OutcomeFailed:
		return "failed"
	case OutcomeAmbiguous:
		return "ambiguous"
	}
	return ""
}

// Ledger accumulates the attempts of one request so that the outcome is
// told from all of them, whatever rule stopped the retries. The zero value
// is ready; it does not allocate.
type Ledger struct {
	Attempts int
	// allSentSeen: some attempt got past not_sent; noResponse: some attempt
	// ended sent_no_response.
	allSentSeen  bool
	noResponse   bool
	LastStatus   int
	LastFailure  Category
	LastEvidence Evidence
	// AmbiguousStatus: the last response was a 502-504 that the engine
	// called ambiguous; it is relayed with Egret-Outcome: ambiguous.
	AmbiguousStatus bool
	// Refreshed: the credential refresher was used for this request.
	Refreshed bool
	// PrevWait is the last wait, for decorrelated jitter.
	PrevWait time.Duration
}

// Record notes how an attempt ended and what the engine decided for it.
func (l *Ledger) Record(ev Evidence, failure Category, status int, r Result) {
	l.Attempts++
	if ev != NotSent {
		l.allSentSeen = true
	}
	if ev == SentNoResponse {
		l.noResponse = true
	}
	l.LastEvidence, l.LastFailure = ev, failure
	if ev == ResponseReceived {
		l.LastStatus = status
		l.AmbiguousStatus = r.Decision == Ambiguous && r.Reason == ReasonStatus
	} else {
		l.AmbiguousStatus = false
	}
	if r.Decision == Retry {
		l.PrevWait = r.Wait
	}
}

// Outcome tells the caller's answer when no response is relayed; idempotent
// is the request's resolved idempotency. With a relayed ambiguous status it
// returns OutcomeAmbiguous, otherwise OutcomeNone when a response exists.
func (l *Ledger) Outcome(idempotent bool, haveResponse bool) Outcome {
	if haveResponse {
		if l.AmbiguousStatus {
			return OutcomeAmbiguous
		}
		return OutcomeNone
	}
	switch {
	case !l.allSentSeen:
		return OutcomeNotSent
	case idempotent:
		return OutcomeFailed
	case l.noResponse:
		return OutcomeAmbiguous
	}
	// Not idempotent, no attempt ended sent_no_response, yet one got past
	// not_sent: a partial response. The server answered, so it ran; the
	// spec's table has no row for this and "failed" is the true answer.
	return OutcomeFailed
}

// Status is the proxy's status for a failure outcome: 503 for not-sent,
// 504 when the last attempt timed out, else 502.
func (l *Ledger) Status(o Outcome) int {
	switch {
	case o == OutcomeNotSent:
		return 503
	case l.LastFailure.Timeout():
		return 504
	}
	return 502
}
