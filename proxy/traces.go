package proxy

import (
	"sync"

	"github.com/egret-proxy/egret/retry"
)

// Traces keeps the traces of the most recent requests by request id, for
// `egret explain`. It is a ring: the oldest trace goes when a new one comes
// and the ring is full. Safe for concurrent use; shareable by many servers.
type Traces struct {
	mu   sync.Mutex
	ring []retry.Trace
	next int
	byID map[string]int
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
