package retry

import (
	"errors"
	"fmt"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/client"
)

// Sentinels for errors.Is on the errors RoundTrip returns.
var (
	// ErrAmbiguous: a non-idempotent request may or may not have run.
	ErrAmbiguous = errors.New("egret: ambiguous")
	// ErrNotSent: proven that no attempt reached the server.
	ErrNotSent = errors.New("egret: not sent")
	// ErrFailed: the request may have reached the server, and retrying
	// could not help.
	ErrFailed = errors.New("egret: failed")
	// ErrRequestInvalid: the request cannot be sent as it is. It is a
	// cause inside an *Error, whose message already begins with "egret: ";
	// like every cause this package makes, it has no prefix of its own.
	ErrRequestInvalid = client.ErrRequestInvalid
	// ErrNoEndpoint: the upstream's Endpoints had none to offer (a
	// Service without a ready or serving endpoint); nothing was dialled.
	ErrNoEndpoint = errors.New("no endpoint available")
	// ErrProfileRejected: a policy refused the request before dispatch
	// (profile_rejected: not sent, permanent), e.g. a dialer that will
	// not connect to the destination. A cause, like ErrRequestInvalid.
	ErrProfileRejected = errors.New("refused by policy")
)

// Error is a failure without a response to relay whose outcome is not-sent
// or failed (spec section 6).
type Error struct {
	Outcome engine.Outcome // OutcomeNotSent or OutcomeFailed
	// Status is what a proxy answers: 503 for not-sent, 504 when the last
	// attempt timed out, else 502.
	Status   int
	Attempts int
	Trace    *Trace
	// Err is the last attempt's cause.
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("egret: %s after %d attempt(s): %v", e.Outcome, e.Attempts, e.Err)
}

// Unwrap returns the last attempt's cause.
func (e *Error) Unwrap() error { return e.Err }

// Is matches ErrNotSent or ErrFailed by the outcome.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrNotSent:
		return e.Outcome == engine.OutcomeNotSent
	case ErrFailed:
		return e.Outcome == engine.OutcomeFailed
	}
	return false
}

// AmbiguousError says a non-idempotent request may or may not have been
// executed by the upstream: some attempt wrote it and no response came. The
// caller must reconcile (query the upstream, or replay with an
// Idempotency-Key); it is never a plain failure.
type AmbiguousError struct {
	// Status is what a proxy answers: 504 when the last attempt timed out,
	// else 502.
	Status   int
	Attempts int
	Trace    *Trace
	Err      error
}

func (e *AmbiguousError) Error() string {
	return fmt.Sprintf("egret: ambiguous after %d attempt(s), the request may have been executed: %v", e.Attempts, e.Err)
}

// Unwrap returns the last attempt's cause.
func (e *AmbiguousError) Unwrap() error { return e.Err }

// Is matches ErrAmbiguous.
func (e *AmbiguousError) Is(target error) bool { return target == ErrAmbiguous }

// AttemptsOf returns the number of attempts an error of RoundTrip reports
// (0 if err is not one).
func AttemptsOf(err error) int {
	var a *AmbiguousError
	var e *Error
	switch {
	case errors.As(err, &a):
		return a.Attempts
	case errors.As(err, &e):
		return e.Attempts
	}
	return 0
}
