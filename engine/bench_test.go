package engine_test

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
)

var sink engine.Result

// BenchmarkDecide: one decision on the common paths (target: <= 100 ns,
// 0 allocations).
func BenchmarkDecide(b *testing.B) {
	cases := map[string]engine.Input{
		"retry_not_sent": {Attempt: 1, MaxAttempts: 3, BudgetTokens: 10, Failure: engine.ConnectRefused, Backoff: engine.DefaultBackoff},
		"ambiguous":      {Attempt: 1, MaxAttempts: 3, BudgetTokens: 10, Failure: engine.ConnectionReset, Backoff: engine.DefaultBackoff},
		"status_429_ra": {Attempt: 1, MaxAttempts: 3, BudgetTokens: 10, Status: 429, HasRetryAfter: true, RetryAfter: 300 * time.Millisecond,
			HasDeadline: true, DeadlineRemaining: 5 * time.Second, MinAttempt: 50 * time.Millisecond, Backoff: engine.DefaultBackoff},
		"status_500_transient": {Attempt: 1, MaxAttempts: 3, BudgetTokens: 10, Status: 500, Idempotent: true,
			TransientStatuses: []int{500, 520, 521}, Backoff: engine.DefaultBackoff},
	}
	for name, in := range cases {
		b.Run(name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				sink = engine.Decide(&in, r)
			}
		})
	}
}

// BenchmarkBudgetParallel: the budget under b.RunParallel, an operation being
// one request's Earn or, for one request in five, also a Spend (target: >= 10
// million operations a second on 2 cores).
func BenchmarkBudgetParallel(b *testing.B) {
	bud := engine.NewBudget(engine.DefaultBudget)
	var spent atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			now := time.Now()
			bud.Earn(now)
			if i++; i%5 == 0 && bud.Spend(now) {
				spent.Add(1)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mops/s")
}

// BenchmarkBudgetEarnParallel: the hot path alone, every request earning.
func BenchmarkBudgetEarnParallel(b *testing.B) {
	bud := engine.NewBudget(engine.DefaultBudget)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bud.Earn(time.Now())
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mops/s")
}
