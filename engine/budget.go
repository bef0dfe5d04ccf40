package engine

import (
	"sync"
	"sync/atomic"
	"time"
)

// BudgetConfig sizes a per-upstream retry budget (spec section 5).
type BudgetConfig struct {
	// Ratio is the tokens each original request (attempt 1) earns.
	Ratio float64
	// MinPerSecond is the floor: tokens a second a quiet upstream may spend.
	MinPerSecond float64
	// TTL is how long earned tokens live.
	TTL time.Duration
}

// DefaultBudget is the spec's default: 0.2 per request, 10 a second, 10 s.
var DefaultBudget = BudgetConfig{Ratio: 0.2, MinPerSecond: 10, TTL: 10 * time.Second}

// budgetSlots is how many slices a TTL is cut into. A finer cut follows the
// traffic more closely; the bound holds for any number.
const budgetSlots = 20

type budgetSlot struct {
	epoch     atomic.Int64 // slot number (time / width) the counts belong to
	originals atomic.Int64
	retries   atomic.Int64
	_         [40]byte // keep slots on their own cache lines
}

// Budget is the retry budget of one upstream on this node. Earn and Spend
// are safe for concurrent use; Earn takes no lock.
//
// The bound it keeps: over any window of TTL, retries are at most
// Ratio * originals in that window + MinPerSecond * TTL. A retry is allowed
// only if, for every suffix of the last TTL that ends now, the retries in it
// (this one included) stay within Ratio * its originals + the floor; an
// original counts only in suffixes that surely contain it and a retry in
// every suffix that may contain it, so slot boundaries never loosen the
// bound.
type Budget struct {
	cfg   BudgetConfig
	width int64 // nanoseconds a slot spans
	floor float64
	mu    sync.Mutex // serialises Spend and slot rotation
	slots [budgetSlots + 1]budgetSlot
}

// NewBudget returns an empty budget. Non-positive fields take the defaults.
func NewBudget(cfg BudgetConfig) *Budget {
	if cfg.Ratio < 0 {
		cfg.Ratio = 0
	}
	if cfg.MinPerSecond < 0 {
		cfg.MinPerSecond = 0
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultBudget.TTL
	}
	w := int64(cfg.TTL) / budgetSlots
	if w <= 0 {
		w = 1
	}
	b := &Budget{cfg: cfg, width: w, floor: cfg.MinPerSecond * cfg.TTL.Seconds()}
	for i := range b.slots {
		b.slots[i].epoch.Store(-1)
	}
	return b
}

// Config returns the budget's configuration.
func (b *Budget) Config() BudgetConfig { return b.cfg }

func (b *Budget) slot(now time.Time) *budgetSlot {
	e := now.UnixNano() / b.width
	s := &b.slots[e%int64(len(b.slots))]
	if s.epoch.Load() != e {
		b.mu.Lock()
		if s.epoch.Load() != e {
			s.originals.Store(0)
			s.retries.Store(0)
			s.epoch.Store(e)
		}
		b.mu.Unlock()
	}
	return s
}

// Earn records an original request (attempt 1) at now.
func (b *Budget) Earn(now time.Time) { b.slot(now).originals.Add(1) }

// Tokens returns the retry tokens available at now (rule 2 needs >= 1).
func (b *Budget) Tokens(now time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokensLocked(now)
}

func (b *Budget) tokensLocked(now time.Time) float64 {
	e := now.UnixNano() / b.width
	n := int64(len(b.slots))
	least := b.floor
	var originals, retries int64
	// Walk back from the current slot. The suffix that starts in slot k may
	// start anywhere inside it: its retries count, its originals do not.
	for k := int64(0); k < n; k++ {
		s := &b.slots[(e-k)%n]
		if s.epoch.Load() != e-k {
			if k == 0 {
				continue
			}
			// A slot never touched since: no traffic then.
			if tok := b.cfg.Ratio*float64(originals) + b.floor - float64(retries); tok < least {
				least = tok
			}
			continue
		}
		retries += s.retries.Load()
		if tok := b.cfg.Ratio*float64(originals) + b.floor - float64(retries); tok < least {
			least = tok
		}
		originals += s.originals.Load()
	}
	return least
}

// Spend takes one retry token at now if there is one, and reports whether
// it did.
func (b *Budget) Spend(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokensLocked(now) < 1 {
		return false
	}
	e := now.UnixNano() / b.width
	s := &b.slots[e%int64(len(b.slots))]
	if s.epoch.Load() != e {
		s.originals.Store(0)
		s.retries.Store(0)
		s.epoch.Store(e)
	}
	s.retries.Add(1)
	return true
}
