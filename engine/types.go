// Package engine decides whether a failed HTTP attempt may be retried.
//
// It implements ../shared/spec/decision.md exactly: the evidence classes, the
// failure categories, body replayability, idempotency resolution, the ordered
// decision rules, the wait before a retry, the per-upstream retry budget and
// the outcome a caller is told. It does no I/O: time and randomness come in
// as arguments, so every answer is reproducible in tests.
package engine

import (
	"errors"
	"fmt"
)

// Errors returned by the parsers in this package; match them with errors.Is.
var (
	ErrUnknownEvidence = errors.New("unknown evidence")
	ErrUnknownCategory = errors.New("unknown failure category")
	ErrUnknownBody     = errors.New("unknown body replayability")
	ErrUnknownBackoff  = errors.New("unknown backoff kind")
	ErrInvalidInput    = errors.New("invalid input")
)

// Evidence says how far an attempt got (spec section 1).
type Evidence uint8

const (
	// EvidenceUnknown is the zero value; Decide derives the evidence from the
	// failure category or the status instead.
	EvidenceUnknown Evidence = iota
	// NotSent: proven that the server never received any of the request.
	NotSent
	// SentNoResponse: some or all of the request may have been written and
	// no final response header arrived.
	SentNoResponse
	// ResponseReceived: final response headers arrived (any status).
	ResponseReceived
	// PartialResponse: headers and part of the body arrived, then the
	// attempt broke.
	PartialResponse
)

var evidenceNames = [...]string{"", "not_sent", "sent_no_response", "response_received", "partial_response"}

func (e Evidence) String() string {
	if int(e) < len(evidenceNames) && e != EvidenceUnknown {
		return evidenceNames[e]
	}
	return fmt.Sprintf("evidence(%d)", uint8(e))
}

// ParseEvidence parses the spec's name of an evidence class.
func ParseEvidence(s string) (Evidence, error) {
	for i := 1; i < len(evidenceNames); i++ {
		if evidenceNames[i] == s {
			return Evidence(i), nil
		}
	}
	return EvidenceUnknown, fmt.Errorf("%w %q (want not_sent, sent_no_response, response_received or partial_response)", ErrUnknownEvidence, s)
}

// Category is a failure category (spec section 2). CategoryNone means the
// attempt did not fail: it ended with a response status.
type Category uint8

const (
	CategoryNone Category = iota
	ProfileRejected
	RequestInvalid
	PoolTimeout
	DNSFailure
	DNSNotFound
	ConnectRefused
	ConnectTimeout
	TLSHandshake
	TLSCertificate
	RefusedStream
	WriteFailed
	ConnectionReset
	ResponseTimeout
	BodyInterrupted
	numCategories
)

type categoryInfo struct {
	name      string
	evidence  Evidence
	permanent bool
	timeout   bool
}

var categories = [numCategories]categoryInfo{
	CategoryNone:    {name: ""},
	ProfileRejected: {"profile_rejected", NotSent, true, false},
	RequestInvalid:  {"request_invalid", NotSent, true, false},
	PoolTimeout:     {"pool_timeout", NotSent, false, true},
	DNSFailure:      {"dns_failure", NotSent, false, false},
	DNSNotFound:     {"dns_not_found", NotSent, true, false},
	ConnectRefused:  {"connect_refused", NotSent, false, false},
	ConnectTimeout:  {"connect_timeout", NotSent, false, true},
	TLSHandshake:    {"tls_handshake", NotSent, false, false},
	TLSCertificate:  {"tls_certificate", NotSent, true, false},
	RefusedStream:   {"refused_stream", NotSent, false, false},
	WriteFailed:     {"write_failed", SentNoResponse, false, false},
	ConnectionReset: {"connection_reset", SentNoResponse, false, false},
	ResponseTimeout: {"response_timeout", SentNoResponse, false, true},
	BodyInterrupted: {"body_interrupted", PartialResponse, false, false},
}

// Categories lists every failure category in the spec's order.
func Categories() []Category {
	out := make([]Category, 0, numCategories-1)
	for c := Category(1); c < numCategories; c++ {
		out = append(out, c)
	}
	return out
}

func (c Category) String() string {
	if c < numCategories && c != CategoryNone {
		return categories[c].name
	}
	if c == CategoryNone {
		return "none"
	}
	return fmt.Sprintf("category(%d)", uint8(c))
}

// Evidence is the evidence the failing stage proves.
func (c Category) Evidence() Evidence {
	if c < numCategories {
		return categories[c].evidence
	}
	return EvidenceUnknown
}

// Permanent reports whether retrying cannot help.
func (c Category) Permanent() bool { return c < numCategories && categories[c].permanent }

// Timeout reports whether the category is a timeout; a caller answered
// without a response then gets 504 rather than 502.
func (c Category) Timeout() bool { return c < numCategories && categories[c].timeout }

// ParseCategory parses the spec's name of a failure category.
func ParseCategory(s string) (Category, error) {
	for c := Category(1); c < numCategories; c++ {
		if categories[c].name == s {
			return c, nil
		}
	}
	return CategoryNone, fmt.Errorf("%w %q", ErrUnknownCategory, s)
}

// Body is the replayability of a request body (spec section 1).
type Body uint8

const (
	// BodyNone: no body; counts as replayable.
	BodyNone Body = iota
	// BodyReplayable: held in memory.
	BodyReplayable
	// BodyReopenable: spooled to a file, or a supplier that can reopen it.
	BodyReopenable
	// BodyOneShot: a stream that can be read once.
	BodyOneShot
)

var bodyNames = [...]string{"none", "replayable", "reopenable", "one_shot"}

func (b Body) String() string {
	if int(b) < len(bodyNames) {
		return bodyNames[b]
	}
	return fmt.Sprintf("body(%d)", uint8(b))
}

// Replayable reports whether a body of this kind can be sent again.
func (b Body) Replayable() bool { return b != BodyOneShot }

// ParseBody parses the spec's name of a body kind.
func ParseBody(s string) (Body, error) {
	for i, n := range bodyNames {
		if n == s {
			return Body(i), nil
		}
	}
	return BodyNone, fmt.Errorf("%w %q (want none, replayable, reopenable or one_shot)", ErrUnknownBody, s)
}

// Weakest returns the replayability of a multipart body: that of its weakest
// part. No parts is BodyNone.
func Weakest(parts ...Body) Body {
	w := BodyNone
	for _, p := range parts {
		if p > w {
			w = p
		}
	}
	return w
}

// Decision is the engine's answer.
type Decision uint8

const (
	Deny Decision = iota
	Retry
	Ambiguous
)

func (d Decision) String() string {
	switch d {
	case Retry:
		return "retry"
	case Ambiguous:
		return "ambiguous"
	default:
		return "deny"
	}
}

// Reason says which rule decided.
type Reason uint8

const (
	ReasonNone Reason = iota
	ReasonMaxAttempts
	ReasonBudgetExhausted
	ReasonBodyNotReplayable
	ReasonResponseAlreadyDelivered
	ReasonRuntimeDraining
	ReasonDeadline
	ReasonPermanentFailure
	ReasonNoResponse
	ReasonNotSent
	ReasonPartialResponse
	ReasonStatus
	ReasonTooEarly
	ReasonUnauthorized
	ReasonRetryAfter
)

var reasonNames = [...]string{"", "max_attempts", "budget_exhausted", "body_not_replayable",
	"response_already_delivered", "runtime_draining", "deadline", "permanent_failure",
	"no_response", "not_sent", "partial_response", "status", "too_early", "unauthorized", "retry_after"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}
