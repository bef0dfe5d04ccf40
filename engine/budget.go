package engine

import (
	"math"
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

// normal is cfg as a budget takes it: a TTL <= 0 is the default, negative
// ratios and floors are 0.
func (cfg BudgetConfig) normal() BudgetConfig {
	cfg.Ratio = max(cfg.Ratio, 0)
	cfg.MinPerSecond = max(cfg.MinPerSecond, 0)
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultBudget.TTL
	}
	return cfg
}

// DefaultBudget is the spec's default: 0.2 per request, 10 a second, 10 s.
var DefaultBudget = BudgetConfig{Ratio: 0.2, MinPerSecond: 10, TTL: 10 * time.Second}

const (
	// budgetSlots is how many slices a TTL is cut into. A retry's check
	// walks them, so more slices cost Spend time but not Earn time.
	budgetSlots = 20
	// unit is one token in the fixed point the counters use.
	unit = 1 << 20
)

// budgetSlot holds the traffic of one slice of time. Within the slice the
// events form a sequence of +ratio (original) and -1 (retry); minSuffix is
// the least sum of any suffix of that sequence, the empty one included, so
// that the check below is exact about where inside a slice a window starts.
type budgetSlot struct {
	epoch     atomic.Int64 // slot number (time / width) the counts belong to
	originals atomic.Int64
	minSuffix atomic.Int64 // in units, <= 0
	retries   int64        // under Budget.mu
	_         [32]byte     // keep slots on their own cache lines
}

// Budget is the retry budget of one upstream on this node. Earn and Spend
// are safe for concurrent use; Earn takes no lock in the steady state.
//
// It keeps the bound of the spec: over any window of TTL, retries are at
// most Ratio * originals in the window + MinPerSecond * TTL. A retry is
// allowed only if every window that contains it still fits: for each start
// inside the last TTL, the retries since it (this one included) stay within
// Ratio * the originals since it plus the floor. Originals that arrive later
// in such a window only raise its allowance, and later retries are checked
// in their turn, so the bound holds for every window.
type Budget struct {
	cfg        BudgetConfig
	width      int64 // nanoseconds a slot spans
	ratioUnits int64
	floorUnits int64
	mu         sync.Mutex // serialises Spend and slot rotation
	latest     int64      // newest slot number seen, under mu: time never runs back
	// used is the last time (unix nanoseconds) Budgets.Get handed the
	// budget out.
	used  atomic.Int64
	slots [budgetSlots + 1]budgetSlot
}

// NewBudget returns an empty budget. A TTL <= 0 takes the default; negative
// ratios and floors count as 0.
func NewBudget(cfg BudgetConfig) *Budget {
	cfg = cfg.normal()
	b := &Budget{
		cfg:        cfg,
		width:      max(int64(cfg.TTL)/budgetSlots, 1),
		ratioUnits: int64(math.Round(cfg.Ratio * unit)),
		floorUnits: int64(math.Floor(cfg.MinPerSecond * cfg.TTL.Seconds() * unit)),
	}
	for i := range b.slots {
		b.slots[i].epoch.Store(-1)
	}
	return b
}

// touch records that the budget was handed out at now.
func (b *Budget) touch(now time.Time) {
	t := now.UnixNano()
	if b.used.Load() < t {
		b.used.Store(t)
	}
}

// idle reports whether nothing used the budget for longer than its TTL
// before now: neither a Get nor a token earned or spent. Its allowance is
// then the floor, as a fresh budget's.
func (b *Budget) idle(now time.Time) bool {
	t := now.UnixNano()
	if t-b.used.Load() <= int64(b.cfg.TTL) {
		return false
	}
	newest := int64(-1)
	for i := range b.slots {
		newest = max(newest, b.slots[i].epoch.Load())
	}
	// The newest slot's slice ends at (newest+1)*width: its events are
	// no older than that.
	return newest < 0 || t-(newest+1)*b.width > int64(b.cfg.TTL)
}

// Config returns the budget's configuration.
func (b *Budget) Config() BudgetConfig { return b.cfg }

// slot returns the slot of now, rotating it in if it still holds an older
// slice of time. It returns nil for a time older than the slot's contents
// (a caller delayed by more than a TTL): such an event is dropped.
func (b *Budget) slot(now time.Time) *budgetSlot {
	e := now.UnixNano() / b.width
	s := &b.slots[e%int64(len(b.slots))]
	if cur := s.epoch.Load(); cur != e {
		if cur > e {
			return nil
		}
		b.mu.Lock()
		b.rotateLocked(s, e)
		cur = s.epoch.Load()
		b.mu.Unlock()
		if cur != e {
			return nil
		}
	}
	return s
}

// rotateLocked gives slot s to epoch e if it holds an older one.
func (b *Budget) rotateLocked(s *budgetSlot, e int64) {
	if s.epoch.Load() < e {
		s.originals.Store(0)
		s.minSuffix.Store(0)
		s.retries = 0
		s.epoch.Store(e)
	}
	b.latest = max(b.latest, e)
}

// Earn records an original request (attempt 1) at now.
func (b *Budget) Earn(now time.Time) {
	s := b.slot(now)
	if s == nil {
		return
	}
	s.originals.Add(1)
	for {
		m := s.minSuffix.Load()
		if m >= 0 {
			return // an original cannot lower the least suffix
		}
		if s.minSuffix.CompareAndSwap(m, min(m+b.ratioUnits, 0)) {
			return
		}
	}
}

// Tokens returns the retry tokens available at now (rule 2 needs >= 1).
func (b *Budget) Tokens(now time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return float64(b.tokensLocked(now)) / unit
}

// tokensLocked is the least allowance of any window start in the last TTL,
// in units.
func (b *Budget) tokensLocked(now time.Time) int64 {
	e := max(now.UnixNano()/b.width, b.latest)
	n := int64(len(b.slots))
	least := b.floorUnits
	var after int64 // sum of the slots newer than the one being looked at
	for k := int64(0); k < n; k++ {
		s := &b.slots[(e-k)%n]
		if s.epoch.Load() != e-k {
			continue // no traffic in that slice: no start inside it is worse
		}
		least = min(least, b.floorUnits+after+s.minSuffix.Load())
		after += s.originals.Load()*b.ratioUnits - s.retries*unit
	}
	return least
}

// Spend takes one retry token at now if there is one, and reports whether
// it did.
func (b *Budget) Spend(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokensLocked(now) < unit {
		return false
	}
	e := max(now.UnixNano()/b.width, b.latest)
	s := &b.slots[e%int64(len(b.slots))]
	b.rotateLocked(s, e)
	s.retries++
	s.minSuffix.Add(-unit)
	return true
}
