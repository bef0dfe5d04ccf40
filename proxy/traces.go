package proxy

import (
	"sync"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry"
)

// Traces keeps the traces of the most recent requests by request id, for
// `egret explain`. It is a ring: the oldest trace goes when a new one comes
// and the ring is full. Safe for concurrent use; shareable by many servers.
type Traces struct {
	mu       sync.Mutex
	ring     []retry.Trace
	next     int
	byID     map[string]int
	watchers []*traceWatcher
}

type traceWatcher struct {
	outcome engine.Outcome
	ch      chan retry.Trace
	dropped uint64
}

// Watch returns a channel that gets a copy of every trace Put from now on
// whose outcome is o, and a function that stops the watch and closes the
// channel. Put never waits for a watcher: one that falls more than buffer
// traces behind misses the newer ones (stop returns how many).
func (t *Traces) Watch(o engine.Outcome, buffer int) (<-chan retry.Trace, func() (dropped uint64)) {
	w := &traceWatcher{outcome: o, ch: make(chan retry.Trace, buffer)}
	t.mu.Lock()
	t.watchers = append(t.watchers, w)
	t.mu.Unlock()
	var once sync.Once
	return w.ch, func() uint64 {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			for i, x := range t.watchers {
				if x == w {
					t.watchers = append(t.watchers[:i], t.watchers[i+1:]...)
					break
				}
			}
			close(w.ch)
		})
		t.mu.Lock()
		defer t.mu.Unlock()
		return w.dropped
	}
}

// DefaultTraces is the ring size NewTraces uses for a size <= 0.
const DefaultTraces = 4096

// NewTraces returns a store of the last size traces.
func NewTraces(size int) *Traces {
	if size <= 0 {
		size = DefaultTraces
	}
	return &Traces{ring: make([]retry.Trace, 0, size), byID: make(map[string]int, size)}
}

// Put stores tr (copied), replacing the oldest trace when full. The copy
// of the attempts goes into the array of the trace it replaces (Get hands
// out copies only), so that a full ring stores without allocating.
func (t *Traces) Put(tr *retry.Trace) {
	if tr == nil || tr.RequestID == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.byID[tr.RequestID]
	if !ok {
		if len(t.ring) < cap(t.ring) {
			t.ring = append(t.ring, retry.Trace{})
			i = len(t.ring) - 1
		} else {
			i = t.next
			delete(t.byID, t.ring[i].RequestID)
			t.next = (t.next + 1) % len(t.ring)
		}
		t.byID[tr.RequestID] = i
	}
	attempts := t.ring[i].Attempts[:0]
	t.ring[i] = *tr
	t.ring[i].Attempts = append(attempts, tr.Attempts...)
	for _, w := range t.watchers {
		if w.outcome != tr.Outcome {
			continue
		}
		c := *tr
		c.Attempts = append([]retry.Attempt(nil), tr.Attempts...)
		select {
		case w.ch <- c:
		default:
			w.dropped++
		}
	}
}

// Get returns the trace of request id.
func (t *Traces) Get(id string) (retry.Trace, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.byID[id]
	if !ok {
		return retry.Trace{}, false
	}
	c := t.ring[i]
	c.Attempts = append([]retry.Attempt(nil), c.Attempts...)
	return c, true
}

// Len is the number of traces held.
func (t *Traces) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.ring)
}
