package engine

import "sync"

// Budgets holds the node-wide retry budget of every upstream, keyed by the
// upstream's name. Safe for concurrent use.
type Budgets struct {
	mu sync.RWMutex
	m  map[string]*Budget
}

// NewBudgets returns an empty registry.
func NewBudgets() *Budgets { return &Budgets{m: make(map[string]*Budget)} }

// Get returns the budget of upstream, creating it with cfg. A budget whose
// configuration changed is replaced by a fresh one with the new sizes.
func (r *Budgets) Get(upstream string, cfg BudgetConfig) *Budget {
	r.mu.RLock()
	b := r.m[upstream]
	r.mu.RUnlock()
	if b != nil && b.cfg == cfg {
		return b
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b = r.m[upstream]; b == nil || b.cfg != cfg {
		b = NewBudget(cfg)
		r.m[upstream] = b
	}
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
