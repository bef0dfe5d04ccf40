package engine

import (
	"math/rand/v2"
	"time"
)

// BackoffKind selects the jitter of the exponential wait (spec section 4).
type BackoffKind uint8

const (
	// FullJitter: uniform(0, min(max, base * 2^(n-1))).
	FullJitter BackoffKind = iota
	// DecorrelatedJitter: min(max, uniform(base, max(base, 3 * prev))).
	DecorrelatedJitter
)

func (k BackoffKind) String() string {
	if k == DecorrelatedJitter {
		return "decorrelated"
	}
	return "full"
}

// ParseBackoffKind parses "full" or "decorrelated".
func ParseBackoffKind(s string) (BackoffKind, error) {
	switch s {
	case "full":
		return FullJitter, nil
	case "decorrelated":
		return DecorrelatedJitter, nil
	}
	return FullJitter, ErrUnknownBackoff
}

// Backoff bounds the wait before a retry.
type Backoff struct {
	Kind BackoffKind
	Base time.Duration
	Max  time.Duration
}

// DefaultBackoff is the spec's default: full jitter from 25 ms to 1 s.
var DefaultBackoff = Backoff{Kind: FullJitter, Base: 25 * time.Millisecond, Max: time.Second}

// The spec's defaults of max_attempts and min_attempt (section 7), which
// the Go API and the proxy's embedded policy take too.
const (
	DefaultMaxAttempts = 3
	DefaultMinAttempt  = 50 * time.Millisecond
)

// Rand is the random source of the jitter. *math/rand/v2.Rand satisfies it.
type Rand interface {
	// Int64N returns a uniform number in [0, n); n > 0.
	Int64N(n int64) int64
}

// DefaultRand draws from math/rand/v2's goroutine-safe generator.
var DefaultRand Rand = globalRand{}

type globalRand struct{}

func (globalRand) Int64N(n int64) int64 { return rand.Int64N(n) }

// Input is everything one decision depends on. The zero value of a field is
// its "absent" state where the spec has one (no deadline, no status...).
type Input struct {
	// Attempt is the number of the attempt that just ended, from 1.
	Attempt int
	// MaxAttempts bounds the attempts, the first included.
	MaxAttempts int
	// BudgetTokens is the retry tokens this upstream has now.
	BudgetTokens float64
	Body         Body
	// ResponseDelivered: a byte of the response already reached the caller.
	ResponseDelivered bool
	Draining          bool
	// HasDeadline with DeadlineRemaining: the time left of the overall
	// deadline. MinAttempt is the least time worth starting an attempt with.
	HasDeadline       bool
	DeadlineRemaining time.Duration
	MinAttempt        time.Duration
	// Failure is the failure category, CategoryNone when a status arrived.
	Failure Category
	// Evidence overrides the evidence of the failure category (a kernel
	// witness may have upgraded it). EvidenceUnknown derives it.
	Evidence   Evidence
	Idempotent bool
	// Status is the response status, 0 when none.
	Status int
	// HasRetryAfter with RetryAfter: the response's Retry-After.
	HasRetryAfter bool
	RetryAfter    time.Duration
	// TransientStatuses are statuses the upstream registered as transient.
	TransientStatuses []int
	// CanRefresh: the upstream has a credential refresher; Refreshed: it was
	// already used for this request.
	CanRefresh bool
	Refreshed  bool
	Backoff    Backoff
	// PrevWait is the last wait for decorrelated jitter; 0 means none yet
	// (Backoff.Base is used).
	PrevWait time.Duration
}

// Result is the engine's answer. Wait is set only with Retry.
type Result struct {
	Decision Decision
	Reason   Reason
	Wait     time.Duration
}

// EffectiveEvidence is the evidence the decision uses.
func (in *Input) EffectiveEvidence() Evidence {
	if in.Evidence != EvidenceUnknown {
		return in.Evidence
	}
	if in.Failure != CategoryNone {
		return in.Failure.Evidence()
	}
	if in.Status != 0 { // final headers arrived
		return ResponseReceived
	}
	return EvidenceUnknown
}

func deny(r Reason) Result { return Result{Decision: Deny, Reason: r} }

// Decide applies the spec's rules in order. It never allocates and never
// blocks; rnd is consulted only for a retry.
func Decide(in *Input, rnd Rand) Result {
	ev := in.EffectiveEvidence()
	if in.Failure == CategoryNone && in.Status != 0 && in.Status < 400 {
		return deny(ReasonStatus) // a success is never retried
	}
	switch {
	case in.Attempt >= in.MaxAttempts: // 1
		return deny(ReasonMaxAttempts)
	case in.BudgetTokens < 1: // 2
		return deny(ReasonBudgetExhausted)
	case !in.Body.Replayable(): // 3
		return deny(ReasonBodyNotReplayable)
	case in.ResponseDelivered: // 4
		return deny(ReasonResponseAlreadyDelivered)
	case in.Draining: // 5
		return deny(ReasonRuntimeDraining)
	case in.HasDeadline && in.DeadlineRemaining < in.MinAttempt: // 6
		return deny(ReasonDeadline)
	case in.Failure.Permanent(): // 7
		return deny(ReasonPermanentFailure)
	case ev == SentNoResponse && !in.Idempotent: // 8
		return Result{Decision: Ambiguous, Reason: ReasonNoResponse}
	}
	// 9
	if in.Failure != CategoryNone || in.Status == 0 || ev != ResponseReceived {
		switch ev {
		case NotSent:
			return in.retry(ReasonNotSent, rnd)
		case SentNoResponse:
			return in.retry(ReasonNoResponse, rnd)
		case PartialResponse:
			if in.Idempotent {
				return in.retry(ReasonPartialResponse, rnd)
			}
			return deny(ReasonPartialResponse)
		}
		// Nothing says how far the attempt got: never guess.
		return deny(ReasonStatus)
	}
	switch s := in.Status; {
	case s == 408:
		return in.retry(ReasonStatus, rnd)
	case s == 425:
		if in.Attempt == 1 {
			return in.retry(ReasonStatus, rnd)
		}
		return deny(ReasonTooEarly)
	case s == 429:
		return in.retry(ReasonStatus, rnd)
	case s == 401:
		if in.Idempotent && in.CanRefresh && !in.Refreshed {
			return in.retry(ReasonStatus, rnd)
		}
		return deny(ReasonUnauthorized)
	case s == 502 || s == 503 || s == 504:
		if in.Idempotent {
			return in.retry(ReasonStatus, rnd)
		}
		return Result{Decision: Ambiguous, Reason: ReasonStatus}
	case s >= 500:
		if in.Idempotent && in.transient(s) {
			return in.retry(ReasonStatus, rnd)
		}
		return deny(ReasonStatus)
	}
	return deny(ReasonStatus)
}

func (in *Input) transient(status int) bool {
	for _, s := range in.TransientStatuses {
		if s == status {
			return true
		}
	}
	return false
}

// retry computes the wait (spec section 4); a Retry-After that cannot fit
// turns the retry into deny retry_after.
func (in *Input) retry(r Reason, rnd Rand) Result {
	wait := in.Backoff.exponential(in.Attempt, in.PrevWait, rnd)
	ra, hasRA := in.RetryAfter, in.HasRetryAfter && (in.Status == 429 || in.Status == 503)
	if hasRA {
		if ra < 0 {
			ra = 0
		}
		wait = max(wait, ra)
	}
	if in.HasDeadline {
		room := in.DeadlineRemaining - in.MinAttempt
		if hasRA && ra > room {
			return deny(ReasonRetryAfter)
		}
		wait = min(wait, room)
	} else if hasRA && ra > in.Backoff.Max {
		return deny(ReasonRetryAfter)
	}
	return Result{Decision: Retry, Reason: r, Wait: wait}
}

// exponential is the jittered part of the wait after attempt n.
func (b Backoff) exponential(n int, prev time.Duration, rnd Rand) time.Duration {
	switch b.Kind {
	case DecorrelatedJitter:
		if prev <= 0 {
			prev = b.Base
		}
		hi := max(b.Base, 3*prev)
		return min(b.Max, b.Base+uniform(rnd, hi-b.Base))
	default:
		ceil := b.Max
		if n >= 1 && n < 63 {
			shift := n - 1
			// base * 2^(n-1) without overflow.
			if b.Base <= b.Max>>shift {
				ceil = min(b.Max, b.Base<<shift)
			}
		}
		return uniform(rnd, ceil)
	}
}

// uniform returns a duration in [0, d], both ends included.
func uniform(rnd Rand, d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	if d == 1<<63-1 {
		d--
	}
	return time.Duration(rnd.Int64N(int64(d) + 1))
}
