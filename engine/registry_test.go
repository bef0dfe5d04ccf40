package engine_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/egret-proxy/egret/engine"
)

// An upstream idle past its TTL is forgotten; one in use is kept, and a
// forgotten one comes back with a fresh budget, which allows what the old
// one would have (the floor).
func TestBudgetsForgetIdle(t *testing.T) {
	cfg := engine.BudgetConfig{Ratio: 0.5, MinPerSecond: 1, TTL: 10 * time.Second}
	r := engine.NewBudgets()
	t0 := time.Unix(1000, 0)
	busy := r.Get("busy:80", cfg, t0)
	quiet := r.Get("quiet:80", cfg, t0)
	quiet.Earn(t0)
	if !quiet.Spend(t0) {
		t.Fatal("quiet: no token at the start")
	}
	for s := range 25 { // busy keeps getting traffic, quiet none
		now := t0.Add(time.Duration(s) * time.Second)
		r.Get("busy:80", cfg, now).Earn(now)
		if got, want := r.Sweep(now), 0; s <= 10 && got != want {
			t.Fatalf("%ds: Sweep forgot %d, want %d (nothing idle for a TTL yet)", s, got, want)
		}
	}
	if r.Len() != 1 {
		t.Fatalf("after 25 s the registry holds %d upstreams, want 1 (quiet forgotten)", r.Len())
	}
	now := t0.Add(25 * time.Second)
	if r.Get("busy:80", cfg, now) != busy {
		t.Fatal("the busy upstream's budget was replaced")
	}
	q2 := r.Get("quiet:80", cfg, now)
	if q2 == quiet {
		t.Fatal("the quiet upstream's budget was kept")
	}
	if got, want := q2.Tokens(now), quiet.Tokens(now); got != want {
		t.Fatalf("a fresh budget allows %v, the forgotten one %v", got, want)
	}
	// Spending alone (a long request's retry) keeps a budget.
	r2 := engine.NewBudgets()
	b := r2.Get("slow:80", cfg, t0)
	b.Earn(t0)
	b.Spend(t0.Add(9 * time.Second))
	if n := r2.Sweep(t0.Add(15 * time.Second)); n != 0 {
		t.Fatalf("a budget spent from 6 s ago was forgotten (%d)", n)
	}
	if n := r2.Sweep(t0.Add(20 * time.Second)); n != 1 {
		t.Fatalf("a budget idle for 11 s was kept (%d forgotten)", n)
	}
}

// 100,000 distinct upstreams, one request each, 1 ms apart (an injected
// clock): Get's own sweeps keep the registry to the upstreams of the last
// TTL and a half, and its memory with it.
func TestBudgetsMemory100k(t *testing.T) {
	const n = 100_000
	cfg := engine.DefaultBudget // TTL 10 s
	step := time.Millisecond
	// Live at most: a TTL and a slot of traffic, plus what accumulates
	// between two sweeps (half a TTL).
	bound := int((cfg.TTL + cfg.TTL/20 + cfg.TTL/2) / step)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	r := engine.NewBudgets()
	t0 := time.Unix(1000, 0)
	most := 0
	for i := range n {
		now := t0.Add(time.Duration(i) * step)
		r.Get(fmt.Sprintf("host-%d.example:443", i), cfg, now).Earn(now)
		most = max(most, r.Len())
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	grown := int64(ms.HeapAlloc) - int64(before)
	size := int64(unsafe.Sizeof(engine.Budget{}))
	t.Logf("%d upstreams: at most %d held at once (bound %d), %d at the end; heap grew %.1f MiB (all %d kept would take %.1f MiB of budgets alone)",
		n, most, bound, r.Len(), float64(grown)/(1<<20), n, float64(size*n)/(1<<20))
	if most > bound {
		t.Fatalf("the registry held %d upstreams at once, more than %d", most, bound)
	}
	if grown > int64(bound)*(size+512) {
		t.Fatalf("heap grew %d bytes, more than %d upstreams' worth (%d)", grown, bound, int64(bound)*(size+512))
	}
	// Traffic stops: a sweep a TTL later forgets everything.
	end := t0.Add(n*step + cfg.TTL + time.Second)
	r.Sweep(end)
	if r.Len() != 0 {
		t.Fatalf("%d upstreams still held a TTL after the last request", r.Len())
	}
	runtime.KeepAlive(r)
}
