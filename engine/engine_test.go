package engine_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
)

// TestCategoriesTable pins section 2 of the spec: each category's name,
// evidence and permanence, and the timeouts that make a 504.
func TestCategoriesTable(t *testing.T) {
	want := []struct {
		name      string
		evidence  engine.Evidence
		permanent bool
	}{
		{"profile_rejected", engine.NotSent, true},
		{"request_invalid", engine.NotSent, true},
		{"pool_timeout", engine.NotSent, false},
		{"dns_failure", engine.NotSent, false},
		{"dns_not_found", engine.NotSent, true},
		{"connect_refused", engine.NotSent, false},
		{"connect_timeout", engine.NotSent, false},
		{"tls_handshake", engine.NotSent, false},
		{"tls_certificate", engine.NotSent, true},
		{"refused_stream", engine.NotSent, false},
		{"write_failed", engine.SentNoResponse, false},
		{"connection_reset", engine.SentNoResponse, false},
		{"response_timeout", engine.SentNoResponse, false},
		{"body_interrupted", engine.PartialResponse, false},
	}
	cats := engine.Categories()
	if len(cats) != len(want) {
		t.Fatalf("%d categories, spec has %d", len(cats), len(want))
	}
	for i, w := range want {
		c, err := engine.ParseCategory(w.name)
		if err != nil || c != cats[i] || c.String() != w.name {
			t.Errorf("%s: parsed %v (%v), listed %v", w.name, c, err, cats[i])
		}
		if c.Evidence() != w.evidence || c.Permanent() != w.permanent {
			t.Errorf("%s: evidence %v permanent %v", w.name, c.Evidence(), c.Permanent())
		}
	}
	if _, err := engine.ParseCategory("timeout"); !errors.Is(err, engine.ErrUnknownCategory) {
		t.Errorf("unknown category: %v", err)
	}
	for _, c := range []engine.Category{engine.PoolTimeout, engine.ConnectTimeout, engine.ResponseTimeout} {
		if !c.Timeout() {
			t.Errorf("%v is a timeout", c)
		}
	}
	if engine.ConnectionReset.Timeout() {
		t.Error("a reset is not a timeout")
	}
}

func TestBodyWeakest(t *testing.T) {
	cases := []struct {
		parts []engine.Body
		want  engine.Body
	}{
		{nil, engine.BodyNone},
		{[]engine.Body{engine.BodyReplayable, engine.BodyReopenable}, engine.BodyReopenable},
		{[]engine.Body{engine.BodyReplayable, engine.BodyOneShot, engine.BodyNone}, engine.BodyOneShot},
		{[]engine.Body{engine.BodyNone, engine.BodyReplayable}, engine.BodyReplayable},
	}
	for _, c := range cases {
		if got := engine.Weakest(c.parts...); got != c.want {
			t.Errorf("Weakest(%v) = %v, want %v", c.parts, got, c.want)
		}
	}
	for _, b := range []engine.Body{engine.BodyNone, engine.BodyReplayable, engine.BodyReopenable} {
		if !b.Replayable() {
			t.Errorf("%v counts as replayable", b)
		}
	}
	if engine.BodyOneShot.Replayable() {
		t.Error("one_shot is not replayable")
	}
}

func TestIdempotencyResolution(t *testing.T) {
	cases := []struct {
		name   string
		p      engine.Idempotency
		method string
		key    bool
		want   bool
	}{
		{"GET by method", engine.Idempotency{}, "GET", false, true},
		{"POST by method", engine.Idempotency{}, "POST", false, false},
		{"PATCH by method", engine.Idempotency{}, "PATCH", false, false},
		{"DELETE by method", engine.Idempotency{}, "DELETE", false, true},
		{"route says no to GET", engine.Idempotency{RouteSet: true, Route: false}, "GET", true, false},
		{"route says yes to POST", engine.Idempotency{RouteSet: true, Route: true}, "POST", false, true},
		{"key honoured", engine.Idempotency{HonoursKeys: true}, "POST", true, true},
		{"key not honoured", engine.Idempotency{}, "POST", true, false},
		{"method default off", engine.Idempotency{MethodDefaultOff: true}, "PUT", false, false},
		{"key beats default off", engine.Idempotency{MethodDefaultOff: true, HonoursKeys: true}, "PUT", true, true},
		{"route beats key", engine.Idempotency{RouteSet: true, Route: false, HonoursKeys: true}, "POST", true, false},
		{"lower-case method is not GET", engine.Idempotency{}, "get", false, false},
	}
	for _, c := range cases {
		if got := c.p.Resolve(c.method, c.key); got != c.want {
			t.Errorf("%s: got %v", c.name, got)
		}
	}
}

// seqRand returns the given draws in turn.
type seqRand struct{ draws []int64 }

func (s *seqRand) Int64N(n int64) int64 {
	d := s.draws[0] % n
	s.draws = s.draws[1:]
	return d
}

func TestWaitBounds(t *testing.T) {
	ms := time.Millisecond
	full := engine.Backoff{Kind: engine.FullJitter, Base: 100 * ms, Max: 1000 * ms}
	retry := func(in engine.Input) engine.Result {
		if in.MaxAttempts == 0 {
			in.MaxAttempts = 10
		}
		in.BudgetTokens = 10
		if in.Failure == engine.CategoryNone && in.Status == 0 {
			in.Failure = engine.ConnectRefused
		}
		return engine.Decide(&in, highRand{})
	}
	// Full jitter's ceiling doubles per attempt up to max_backoff.
	for n, want := range map[int]time.Duration{1: 100 * ms, 2: 200 * ms, 3: 400 * ms, 4: 800 * ms, 5: 1000 * ms, 9: 1000 * ms} {
		if got := retry(engine.Input{Attempt: n, Backoff: full}); got.Wait != want {
			t.Errorf("full jitter after attempt %d: highest wait %v, want %v", n, got.Wait, want)
		}
	}
	// A huge attempt number does not overflow.
	if got := retry(engine.Input{Attempt: 70, MaxAttempts: 100, Backoff: full}); got.Wait != 1000*ms {
		t.Errorf("attempt 70: %v", got.Wait)
	}
	// Decorrelated: uniform(base, max(base, 3*prev)), capped.
	dec := engine.Backoff{Kind: engine.DecorrelatedJitter, Base: 100 * ms, Max: 5000 * ms}
	if got := retry(engine.Input{Attempt: 1, Backoff: dec, PrevWait: 400 * ms}); got.Wait != 1200*ms {
		t.Errorf("decorrelated high end: %v", got.Wait)
	}
	in := engine.Input{Attempt: 1, MaxAttempts: 3, BudgetTokens: 1, Failure: engine.ConnectRefused, Backoff: dec}
	if got := engine.Decide(&in, lowRand{}); got.Wait != 100*ms {
		t.Errorf("decorrelated low end: %v", got.Wait)
	}
	if got := retry(engine.Input{Attempt: 1, Backoff: dec}); got.Wait != 300*ms {
		t.Errorf("decorrelated without prev uses base: %v", got.Wait)
	}
	if got := retry(engine.Input{Attempt: 1, Backoff: dec, PrevWait: 4000 * ms}); got.Wait != 5000*ms {
		t.Errorf("decorrelated cap: %v", got.Wait)
	}
	// Retry-After is a floor for 429 and 503 only.
	if got := retry(engine.Input{Attempt: 1, Status: 429, HasRetryAfter: true, RetryAfter: 700 * ms, Backoff: full}); got.Wait != 700*ms {
		t.Errorf("429 Retry-After floor: %v", got.Wait)
	}
	if got := retry(engine.Input{Attempt: 1, Idempotent: true, Status: 503, HasRetryAfter: true, RetryAfter: 50 * ms, Backoff: full}); got.Wait != 100*ms {
		t.Errorf("503 with a small Retry-After keeps the jitter: %v", got.Wait)
	}
	if got := retry(engine.Input{Attempt: 1, Idempotent: true, Status: 502, HasRetryAfter: true, RetryAfter: 900 * ms, Backoff: full}); got.Wait != 100*ms {
		t.Errorf("502 ignores Retry-After: %v", got.Wait)
	}
	// The deadline's room bounds the wait; a Retry-After beyond it denies.
	dl := engine.Input{Attempt: 3, HasDeadline: true, DeadlineRemaining: 300 * ms, MinAttempt: 50 * ms, Backoff: full}
	if got := retry(dl); got.Wait != 250*ms {
		t.Errorf("wait bounded by room: %v", got.Wait)
	}
	dl.Status, dl.Failure, dl.HasRetryAfter, dl.RetryAfter = 429, engine.CategoryNone, true, 251*ms
	if got := retry(dl); got.Decision != engine.Deny || got.Reason != engine.ReasonRetryAfter {
		t.Errorf("Retry-After past the room: %+v", got)
	}
	dl.RetryAfter = 250 * ms
	if got := retry(dl); got.Decision != engine.Retry || got.Wait != 250*ms {
		t.Errorf("Retry-After exactly the room: %+v", got)
	}
	// Without a deadline, a Retry-After above max_backoff denies.
	if got := retry(engine.Input{Attempt: 1, Status: 429, HasRetryAfter: true, RetryAfter: 1001 * ms, Backoff: full}); got.Reason != engine.ReasonRetryAfter {
		t.Errorf("Retry-After above max without deadline: %+v", got)
	}
	// With a deadline, a Retry-After above max_backoff but inside the room
	// is honoured.
	if got := retry(engine.Input{Attempt: 1, Status: 429, HasRetryAfter: true, RetryAfter: 1500 * ms, HasDeadline: true, DeadlineRemaining: 5 * time.Second, MinAttempt: 50 * ms, Backoff: full}); got.Decision != engine.Retry || got.Wait != 1500*ms {
		t.Errorf("Retry-After above max inside the deadline: %+v", got)
	}
}

// TestJitterIsUniform: the full-jitter draws cover their range evenly.
func TestJitterIsUniform(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	in := engine.Input{Attempt: 1, MaxAttempts: 3, BudgetTokens: 1, Failure: engine.ConnectRefused,
		Backoff: engine.Backoff{Base: 100 * time.Millisecond, Max: time.Second}}
	var buckets [10]int
	const n = 20000
	for i := 0; i < n; i++ {
		w := engine.Decide(&in, r).Wait
		buckets[min(int(w/(10*time.Millisecond)), 9)]++
	}
	for i, c := range buckets {
		if c < n/10*8/10 || c > n/10*12/10 {
			t.Errorf("bucket %d has %d of %d draws", i, c, n)
		}
	}
}

func TestOutcome(t *testing.T) {
	retry := engine.Result{Decision: engine.Retry, Reason: engine.ReasonNotSent, Wait: time.Millisecond}
	denyMax := engine.Result{Decision: engine.Deny, Reason: engine.ReasonMaxAttempts}
	amb := engine.Result{Decision: engine.Ambiguous, Reason: engine.ReasonNoResponse}
	ambStatus := engine.Result{Decision: engine.Ambiguous, Reason: engine.ReasonStatus}

	var l engine.Ledger
	l.Record(engine.NotSent, engine.ConnectRefused, 0, retry)
	l.Record(engine.NotSent, engine.ConnectRefused, 0, denyMax)
	if o := l.Outcome(false, false); o != engine.OutcomeNotSent || l.Status(o) != 503 || l.Attempts != 2 {
		t.Errorf("all not_sent: %v %d", o, l.Status(o))
	}

	l = engine.Ledger{}
	l.Record(engine.SentNoResponse, engine.ResponseTimeout, 0, amb)
	if o := l.Outcome(false, false); o != engine.OutcomeAmbiguous || l.Status(o) != 504 {
		t.Errorf("POST timed out: %v %d", o, l.Status(o))
	}
	// Ambiguous whatever rule stopped the retries: an earlier attempt ended
	// sent_no_response (witness-upgraded retries after it do not erase it).
	l = engine.Ledger{}
	l.Record(engine.SentNoResponse, engine.ConnectionReset, 0, retry)
	l.Record(engine.NotSent, engine.ConnectRefused, 0, denyMax)
	if o := l.Outcome(false, false); o != engine.OutcomeAmbiguous || l.Status(o) != 502 {
		t.Errorf("earlier sent_no_response: %v", o)
	}
	if o := l.Outcome(true, false); o != engine.OutcomeFailed {
		t.Errorf("idempotent: %v", o)
	}
	// A relayed ambiguous status is marked; a relayed plain one is not.
	l = engine.Ledger{}
	l.Record(engine.ResponseReceived, engine.CategoryNone, 503, ambStatus)
	if o := l.Outcome(false, true); o != engine.OutcomeAmbiguous {
		t.Errorf("relayed 503 for POST: %v", o)
	}
	l = engine.Ledger{}
	l.Record(engine.ResponseReceived, engine.CategoryNone, 404, engine.Result{Reason: engine.ReasonStatus})
	if o := l.Outcome(false, true); o != engine.OutcomeNone {
		t.Errorf("relayed 404: %v", o)
	}
	// A non-idempotent partial response ran on the server: failed.
	l = engine.Ledger{}
	l.Record(engine.PartialResponse, engine.BodyInterrupted, 0, engine.Result{Reason: engine.ReasonPartialResponse})
	if o := l.Outcome(false, false); o != engine.OutcomeFailed {
		t.Errorf("partial response: %v", o)
	}
	if l.PrevWait != 0 {
		t.Error("PrevWait set without a retry")
	}
}

func TestParsers(t *testing.T) {
	for _, s := range []string{"not_sent", "sent_no_response", "response_received", "partial_response"} {
		e, err := engine.ParseEvidence(s)
		if err != nil || e.String() != s {
			t.Errorf("%s: %v %v", s, e, err)
		}
	}
	if _, err := engine.ParseEvidence("sent"); !errors.Is(err, engine.ErrUnknownEvidence) {
		t.Error(err)
	}
	for _, s := range []string{"none", "replayable", "reopenable", "one_shot"} {
		b, err := engine.ParseBody(s)
		if err != nil || b.String() != s {
			t.Errorf("%s: %v %v", s, b, err)
		}
	}
	if _, err := engine.ParseBackoffKind("exp"); !errors.Is(err, engine.ErrUnknownBackoff) {
		t.Error(err)
	}
}
