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

// Put stores tr (copied), replacing the oldest trace when full.
func (t *Traces) Put(tr *retry.Trace) {
	if tr == nil || tr.RequestID == "" {
		return
	}
	c := *tr
	c.Attempts = append([]retry.Attempt(nil), tr.Attempts...)
	t.mu.Lock()
	defer t.mu.Unlock()
	if i, ok := t.byID[c.RequestID]; ok {
		t.ring[i] = c
		return
	}
	if len(t.ring) < cap(t.ring) {
		t.ring = append(t.ring, c)
		t.byID[c.RequestID] = len(t.ring) - 1
		return
	}
	delete(t.byID, t.ring[t.next].RequestID)
	t.ring[t.next] = c
	t.byID[c.RequestID] = t.next
	t.next = (t.next + 1) % len(t.ring)
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
