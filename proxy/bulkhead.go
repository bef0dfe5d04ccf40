package proxy

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBulkheadFull: no permit was free within the bulkhead's wait. The retry
// runner counts it as pool_timeout (not_sent).
var ErrBulkheadFull = errors.New("bulkhead full")

// Bulkhead limits the attempts in flight to one upstream. A permit is held
// only while an attempt runs, never during a backoff. It counts permits in
// use, callers waiting and rejections.
type Bulkhead struct {
	sem     chan struct{} // nil: unlimited
	maxWait time.Duration

	inUse    atomic.Int64
	waiting  atomic.Int64
	rejected atomic.Uint64
	onReject func()
}

// NewBulkhead returns a bulkhead of size permits (<= 0: unlimited) whose
// callers wait at most maxWait for one (0: only as long as their context).
func NewBulkhead(size int, maxWait time.Duration) *Bulkhead {
	b := &Bulkhead{maxWait: maxWait}
	if size > 0 {
		b.sem = make(chan struct{}, size)
	}
	return b
}

// Size is the number of permits, 0 for unlimited.
func (b *Bulkhead) Size() int { return cap(b.sem) }

// InUse is the number of permits held now.
func (b *Bulkhead) InUse() int { return int(b.inUse.Load()) }

// Waiting is the number of callers waiting for a permit now.
func (b *Bulkhead) Waiting() int { return int(b.waiting.Load()) }

// Rejected is the number of Acquire calls that got no permit.
func (b *Bulkhead) Rejected() uint64 { return b.rejected.Load() }

// Acquire takes a permit, waiting at most the bulkhead's wait and the
// context. release gives it back; calling it more than once is harmless.
func (b *Bulkhead) Acquire(ctx context.Context) (release func(), err error) {
	if err := b.Enter(ctx); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(b.Leave) }, nil
}

// Enter takes a permit for one attempt (the retry runner's
// retry.Bulkhead), waiting at most the bulkhead's wait and the context.
// Each Enter that succeeds is matched by one Leave.
func (b *Bulkhead) Enter(ctx context.Context) error {
	if b.sem != nil {
		select {
		case b.sem <- struct{}{}:
		default:
			if err := b.wait(ctx); err != nil {
				b.rejected.Add(1)
				if b.onReject != nil {
					b.onReject()
				}
				return err
			}
		}
	}
	b.inUse.Add(1)
	return nil
}

// Leave gives back the permit an Enter took.
func (b *Bulkhead) Leave() {
	b.inUse.Add(-1)
	if b.sem != nil {
		<-b.sem
	}
}

func (b *Bulkhead) wait(ctx context.Context) error {
	b.waiting.Add(1)
	defer b.waiting.Add(-1)
	var timeout <-chan time.Time
	if b.maxWait > 0 {
		t := time.NewTimer(b.maxWait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case b.sem <- struct{}{}:
		return nil
	case <-timeout:
		return ErrBulkheadFull
	case <-ctx.Done():
		return errors.Join(ErrBulkheadFull, ctx.Err())
	}
}

// Bulkheads holds one bulkhead per upstream. It may be shared by the
// listeners of many pods, so that the limit is the node's. Safe for
// concurrent use.
type Bulkheads struct {
	// MaxWait is how long an attempt waits for a permit (default 1 s).
	MaxWait time.Duration
	// OnReject, when set, is called for every rejection (metrics).
	OnReject func(upstream string)

	mu sync.Mutex
	m  map[string]*Bulkhead
}

// NewBulkheads returns an empty registry.
func NewBulkheads() *Bulkheads { return &Bulkheads{MaxWait: time.Second} }

// Get returns upstream's bulkhead of size permits. When the size changed
// (a policy reload) a new bulkhead replaces the old one; permits held in the
// old one are returned to it.
func (r *Bulkheads) Get(upstream string, size int) *Bulkhead {
	if size < 0 {
		size = 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.m[upstream]; b != nil && b.Size() == size {
		return b
	}
	if r.m == nil {
		r.m = make(map[string]*Bulkhead)
	}
	b := NewBulkhead(size, r.MaxWait)
	if r.OnReject != nil {
		b.onReject = func() { r.OnReject(upstream) }
	}
	r.m[upstream] = b
	return b
}

// Lookup returns upstream's bulkhead, nil if none was made yet.
func (r *Bulkheads) Lookup(upstream string) *Bulkhead {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[upstream]
}
