package engine

import (
	"sync"
	"sync/atomic"
	"time"
)

// Budgets holds the node-wide retry budget of every upstream, keyed by the
// upstream's name. Safe for concurrent use.
//
// It forgets an upstream once its budget has been idle (no Get, no earned
// or spent token) for longer than its TTL: such a budget holds nothing a
// fresh one would not (its allowance is back at the floor), so forgetting
// it changes no decision, and the registry's size follows the upstreams
// in use rather than every upstream ever seen. Get sweeps now and then (at
// most once every half TTL), and Sweep does it on demand (a scrape, a
// listing).
type Budgets struct {
	mu sync.RWMutex
	m  map[string]*Budget
	// nextSweep is when Get sweeps next (unix nanoseconds).
	nextSweep atomic.Int64
}

// NewBudgets returns an empty registry.
func NewBudgets() *Budgets { return &Budgets{m: make(map[string]*Budget)} }

// Get returns the budget of upstream at now, creating it with cfg, and
// marks it used. A budget whose configuration changed is replaced by a
// fresh one with the new sizes.
//
// A request that holds a budget past the moment it is forgotten (it got
// it, then spent more than a TTL without any traffic to that upstream
// before retrying) spends from the forgotten budget, whose allowance is
// the floor, while new requests get a fresh one: in that window the
// upstream's retries are bounded by twice the floor, not once.
func (r *Budgets) Get(upstream string, cfg BudgetConfig, now time.Time) *Budget {
	cfg = cfg.normal()
	r.maybeSweep(now, cfg.TTL)
	r.mu.RLock()
	b := r.m[upstream]
	r.mu.RUnlock()
	if b == nil || b.cfg != cfg {
		r.mu.Lock()
		if b = r.m[upstream]; b == nil || b.cfg != cfg {
			b = NewBudget(cfg)
			r.m[upstream] = b
		}
		r.mu.Unlock()
	}
	b.touch(now)
	return b
}

// Each calls fn for every upstream's budget, in no particular order.
func (r *Budgets) Each(fn func(upstream string, b *Budget)) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for k, b := range r.m {
		fn(k, b)
	}
}

// Len is the number of upstreams the registry holds.
func (r *Budgets) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.m)
}

// Sweep forgets the budgets idle at now for longer than their TTL and
// returns how many it forgot.
func (r *Budgets) Sweep(now time.Time) int {
	// Find them under the read lock (Gets go on meanwhile), then remove
	// those still idle under the write lock.
	var idle []string
	r.mu.RLock()
	for k, b := range r.m {
		if b.idle(now) {
			idle = append(idle, k)
		}
	}
	r.mu.RUnlock()
	if len(idle) == 0 {
		return 0
	}
	n := 0
	r.mu.Lock()
	for _, k := range idle {
		if b := r.m[k]; b != nil && b.idle(now) {
			delete(r.m, k)
			n++
		}
	}
	r.mu.Unlock()
	return n
}

// maybeSweep sweeps if the time for it has come; one caller does it.
func (r *Budgets) maybeSweep(now time.Time, ttl time.Duration) {
	if ttl <= 0 {
		ttl = DefaultBudget.TTL
	}
	t := now.UnixNano()
	next := r.nextSweep.Load()
	if t < next || !r.nextSweep.CompareAndSwap(next, t+max(int64(ttl/2), int64(100*time.Millisecond))) {
		return
	}
	if next == 0 {
		return // the first Get only sets the schedule
	}
	r.Sweep(now)
}
