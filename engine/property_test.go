package engine_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
)

// randomInput draws an input over every field's interesting values.
func randomInput(r *rand.Rand) engine.Input {
	statuses := []int{0, 0, 0, 200, 302, 401, 404, 408, 425, 429, 500, 501, 502, 503, 504, 599}
	in := engine.Input{
		Attempt:           1 + r.IntN(5),
		MaxAttempts:       1 + r.IntN(5),
		BudgetTokens:      float64(r.IntN(4)) * 0.5,
		Body:              engine.Body(r.IntN(4)),
		ResponseDelivered: r.IntN(4) == 0,
		Draining:          r.IntN(4) == 0,
		HasDeadline:       r.IntN(2) == 0,
		DeadlineRemaining: time.Duration(r.IntN(3000)) * time.Millisecond,
		MinAttempt:        time.Duration(r.IntN(200)) * time.Millisecond,
		Idempotent:        r.IntN(2) == 0,
		Status:            statuses[r.IntN(len(statuses))],
		HasRetryAfter:     r.IntN(3) == 0,
		RetryAfter:        time.Duration(r.IntN(3000)) * time.Millisecond,
		CanRefresh:        r.IntN(2) == 0,
		Refreshed:         r.IntN(2) == 0,
		Backoff: engine.Backoff{
			Kind: engine.BackoffKind(r.IntN(2)),
			Base: time.Duration(r.IntN(200)) * time.Millisecond,
			Max:  time.Duration(r.IntN(3000)) * time.Millisecond,
		},
		PrevWait: time.Duration(r.IntN(2000)) * time.Millisecond,
	}
	if r.IntN(3) == 0 {
		in.TransientStatuses = []int{500 + r.IntN(100)}
	}
	if in.Status == 0 || r.IntN(5) == 0 {
		cats := engine.Categories()
		in.Failure = cats[r.IntN(len(cats))]
	}
	if r.IntN(5) == 0 {
		in.Evidence = engine.Evidence(1 + r.IntN(4))
	}
	return in
}

// perturbAfter redraws every input that only rules after rule k read.
func perturbAfter(k int, in engine.Input, r *rand.Rand) engine.Input {
	fresh := randomInput(r)
	out := in
	if k < 2 {
		out.BudgetTokens = fresh.BudgetTokens
	}
	if k < 3 {
		out.Body = fresh.Body
	}
	if k < 4 {
		out.ResponseDelivered = fresh.ResponseDelivered
	}
	if k < 5 {
		out.Draining = fresh.Draining
	}
	if k < 6 {
		out.HasDeadline, out.DeadlineRemaining, out.MinAttempt = fresh.HasDeadline, fresh.DeadlineRemaining, fresh.MinAttempt
	}
	if k < 7 {
		out.Failure = fresh.Failure
	}
	// Rules 8 and 9.
	out.Evidence, out.Idempotent = fresh.Evidence, fresh.Idempotent
	// Any failing status, but never a success: a success is not a rule.
	if fresh.Status >= 400 {
		out.Status = fresh.Status
	}
	if out.Failure == engine.CategoryNone && out.Status < 400 {
		out.Status = 503
	}
	out.HasRetryAfter, out.RetryAfter = fresh.HasRetryAfter, fresh.RetryAfter
	out.TransientStatuses = fresh.TransientStatuses
	out.CanRefresh, out.Refreshed = fresh.CanRefresh, fresh.Refreshed
	out.Backoff, out.PrevWait = fresh.Backoff, fresh.PrevWait
	return out
}

var earlyRule = map[engine.Reason]int{
	engine.ReasonMaxAttempts:              1,
	engine.ReasonBudgetExhausted:          2,
	engine.ReasonBodyNotReplayable:        3,
	engine.ReasonResponseAlreadyDelivered: 4,
	engine.ReasonRuntimeDraining:          5,
	engine.ReasonDeadline:                 6,
	engine.ReasonPermanentFailure:         7,
}

// TestLaterRulesNeverReEnable: whatever the inputs of the rules after the
// one that denied, a denial by rules 1-7 stays that denial.
func TestLaterRulesNeverReEnable(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	denials := map[engine.Reason]int{}
	for i := 0; i < 200_000; i++ {
		in := randomInput(r)
		if in.Failure == engine.CategoryNone && in.Status != 0 && in.Status < 400 {
			continue // a success: no rule runs
		}
		res := engine.Decide(&in, r)
		k, early := earlyRule[res.Reason]
		if !early {
			continue
		}
		if res.Decision != engine.Deny {
			t.Fatalf("%+v: rule %d gave %v", in, k, res.Decision)
		}
		denials[res.Reason]++
		for j := 0; j < 8; j++ {
			p := perturbAfter(k, in, r)
			got := engine.Decide(&p, r)
			if got.Decision != engine.Deny || got.Reason != res.Reason {
				t.Fatalf("rule %d denial %v of\n%+v\nbecame %v/%v after later inputs changed:\n%+v", k, res.Reason, in, got.Decision, got.Reason, p)
			}
		}
	}
	for reason := range earlyRule {
		if denials[reason] < 100 {
			t.Errorf("only %d denials by %v: the generator misses a rule", denials[reason], reason)
		}
	}
}

// TestDecisionOrder checks each rule against the one after it on inputs
// where both would match.
func TestDecisionOrder(t *testing.T) {
	base := engine.Input{
		Attempt: 3, MaxAttempts: 3, BudgetTokens: 0, Body: engine.BodyOneShot,
		ResponseDelivered: true, Draining: true, HasDeadline: true,
		DeadlineRemaining: 10 * time.Millisecond, MinAttempt: 50 * time.Millisecond,
		Failure: engine.DNSNotFound, Backoff: engine.DefaultBackoff,
	}
	steps := []struct {
		want engine.Reason
		fix  func(*engine.Input)
	}{
		{engine.ReasonMaxAttempts, func(in *engine.Input) { in.Attempt = 1 }},
		{engine.ReasonBudgetExhausted, func(in *engine.Input) { in.BudgetTokens = 1 }},
		{engine.ReasonBodyNotReplayable, func(in *engine.Input) { in.Body = engine.BodyReopenable }},
		{engine.ReasonResponseAlreadyDelivered, func(in *engine.Input) { in.ResponseDelivered = false }},
		{engine.ReasonRuntimeDraining, func(in *engine.Input) { in.Draining = false }},
		{engine.ReasonDeadline, func(in *engine.Input) { in.HasDeadline = false }},
		{engine.ReasonPermanentFailure, func(in *engine.Input) { in.Failure = engine.WriteFailed }},
		{engine.ReasonNoResponse, func(in *engine.Input) { in.Idempotent = true }},
	}
	in := base
	for i, s := range steps {
		got := engine.Decide(&in, engine.DefaultRand)
		if got.Reason != s.want {
			t.Fatalf("step %d: got %v/%v, want %v", i+1, got.Decision, got.Reason, s.want)
		}
		s.fix(&in)
	}
	if got := engine.Decide(&in, engine.DefaultRand); got.Decision != engine.Retry || got.Reason != engine.ReasonNoResponse {
		t.Fatalf("last: %+v", got)
	}
}
