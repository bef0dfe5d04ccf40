package engine_test

import (
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
)

type event struct {
	at    int64 // ns since epoch of the test clock
	retry bool
}

// checkBound verifies the property of spec section 5 over every window of
// ttl that starts at an event: retries <= ratio*originals + floor*ttl.
func checkBound(t *testing.T, evs []event, cfg engine.BudgetConfig) (worst float64) {
	t.Helper()
	sort.Slice(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	ttl := int64(cfg.TTL)
	floor := cfg.MinPerSecond * cfg.TTL.Seconds()
	j := 0
	var orig, retr int
	for i := range evs {
		// window [evs[i].at, evs[i].at+ttl]
		for j < len(evs) && evs[j].at <= evs[i].at+ttl {
			if evs[j].retry {
				retr++
			} else {
				orig++
			}
			j++
		}
		limit := cfg.Ratio*float64(orig) + floor
		// Only the first of events that share a time starts a window: the
		// window holds all of them.
		first := i == 0 || evs[i-1].at != evs[i].at
		if first && float64(retr) > limit {
			t.Fatalf("window at %d: %d retries > %.1f (ratio %.2f * %d originals + floor %.1f)", evs[i].at, retr, limit, cfg.Ratio, orig, floor)
		}
		if first && limit > 0 && float64(retr)/limit > worst {
			worst = float64(retr) / limit
		}
		if evs[i].retry {
			retr--
		} else {
			orig--
		}
	}
	return worst
}

// TestBudgetBoundConcurrent hammers one budget from many goroutines while a
// clock moves on, then checks the bound over every window. Run with -race.
// The clock stands still while a round of goroutines runs, so that every
// event's time is the time the budget saw.
func TestBudgetBoundConcurrent(t *testing.T) {
	cfg := engine.BudgetConfig{Ratio: 0.2, MinPerSecond: 10, TTL: time.Second}
	b := engine.NewBudget(cfg)
	start := time.Unix(1_700_000_000, 0)
	const workers = 16
	var mu sync.Mutex
	var all []event
	var retries int
	r := rand.New(rand.NewPCG(7, 7))
	var clock int64
	for round := 0; clock < int64(5*cfg.TTL); round++ {
		// Uneven steps; now and then a quiet stretch lets the floor refill.
		clock += int64(r.IntN(int(cfg.TTL / 40)))
		if round%100 == 99 {
			clock += int64(cfg.TTL / 2)
		}
		at := start.Add(time.Duration(clock))
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(seed uint64) {
				defer wg.Done()
				wr := rand.New(rand.NewPCG(seed, 99))
				var local []event
				for i := 0; i < 40; i++ {
					if wr.IntN(3) == 0 { // a failing request asks for a retry
						if b.Spend(at) {
							local = append(local, event{clock, true})
						}
					} else {
						b.Earn(at)
						local = append(local, event{clock, false})
					}
				}
				mu.Lock()
				all = append(all, local...)
				mu.Unlock()
			}(uint64(round*workers + w))
		}
		wg.Wait()
	}
	for _, e := range all {
		if e.retry {
			retries++
		}
	}
	if retries == 0 || retries == len(all) {
		t.Fatalf("degenerate run: %d retries of %d events", retries, len(all))
	}
	worst := checkBound(t, all, cfg)
	t.Logf("%d events, %d retries; fullest window used %.0f%% of its bound", len(all), retries, worst*100)
	if worst < 0.8 {
		t.Errorf("the budget never came near its bound (%.2f): it is stricter than the spec asks", worst)
	}
}

func TestBudgetFloorAndRatio(t *testing.T) {
	cfg := engine.BudgetConfig{Ratio: 0.5, MinPerSecond: 2, TTL: 10 * time.Second}
	b := engine.NewBudget(cfg)
	now := time.Unix(1_800_000_000, 0)
	// A quiet upstream: the floor alone, min_per_second * ttl tokens.
	if got := b.Tokens(now); got != 20 {
		t.Fatalf("quiet tokens = %v, want 20", got)
	}
	n := 0
	for b.Spend(now) {
		n++
	}
	if n != 20 {
		t.Fatalf("spent %d on the floor, want 20", n)
	}
	// With the floor spent, each retry needs 1/ratio originals before it:
	// 100 originals interleaved with retries pay for 50 of them.
	later := now.Add(time.Second)
	n = 0
	for i := 0; i < 100; i++ {
		b.Earn(later)
		if b.Spend(later) {
			n++
		}
	}
	if n != 50 {
		t.Fatalf("spent %d along 100 originals at ratio 0.5, want 50", n)
	}
	// Tokens earned before a retry never pay for a window that starts after
	// them: a burst of originals, then the retries may use the floor only.
	b2 := engine.NewBudget(cfg)
	for i := 0; i < 1000; i++ {
		b2.Earn(now)
	}
	n = 0
	for b2.Spend(now) {
		n++
	}
	if n != 20 {
		t.Fatalf("after a burst of originals, %d retries in a row; the window after the burst allows 20", n)
	}
	// After the ttl the retries expire and the floor is back.
	gone := later.Add(cfg.TTL + 2*time.Second)
	if got := b.Tokens(gone); got != 20 {
		t.Fatalf("tokens after ttl = %v, want 20", got)
	}
}

func TestBudgetTimeNeverRunsBack(t *testing.T) {
	cfg := engine.BudgetConfig{Ratio: 0, MinPerSecond: 1, TTL: time.Second}
	b := engine.NewBudget(cfg)
	now := time.Unix(1_900_000_000, 0)
	if !b.Spend(now) {
		t.Fatal("first spend refused")
	}
	// A caller that read the clock long ago must not erase recent spends.
	if b.Spend(now.Add(-2 * time.Second)) {
		t.Fatal("a spend dated in the past bypassed the recent one")
	}
	b.Earn(now.Add(-30 * time.Second)) // dropped, not a panic or a reset
	if b.Spend(now) {
		t.Fatal("floor of 1 allowed two spends")
	}
}

func TestBudgetsRegistry(t *testing.T) {
	r := engine.NewBudgets()
	a := r.Get("a:80", engine.DefaultBudget, time.Unix(100, 0))
	if r.Get("a:80", engine.DefaultBudget, time.Unix(100, 0)) != a {
		t.Fatal("same upstream, same config: not the same budget")
	}
	if r.Get("b:80", engine.DefaultBudget, time.Unix(100, 0)) == a {
		t.Fatal("budgets shared between upstreams")
	}
	other := engine.DefaultBudget
	other.Ratio = 0.5
	if r.Get("a:80", other, time.Unix(100, 0)) == a {
		t.Fatal("a new configuration kept the old budget")
	}
	n := 0
	r.Each(func(string, *engine.Budget) { n++ })
	if n != 2 {
		t.Fatalf("Each saw %d budgets", n)
	}
}
