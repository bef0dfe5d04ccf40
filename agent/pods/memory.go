package pods

import (
	"context"
	"fmt"
	"sync"
)

// hub holds a set of pods and wakes the runs watching it. Each run keeps
// the set it last sent and diffs against the current one when woken, so no
// change is lost however fast they come (intermediate states may merge).
type hub struct {
	mu      sync.Mutex
	pods    map[string]Pod
	changed chan struct{} // closed and replaced on every change
}

func newHub() *hub {
	return &hub{pods: map[string]Pod{}, changed: make(chan struct{})}
}

func (h *hub) snapshot() (map[string]Pod, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := make(map[string]Pod, len(h.pods))
	for k, v := range h.pods {
		m[k] = v
	}
	return m, h.changed
}

func (h *hub) replace(m map[string]Pod) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pods = m
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *hub) update(fn func(m map[string]Pod) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := make(map[string]Pod, len(h.pods))
	for k, v := range h.pods {
		m[k] = v
	}
	if err := fn(m); err != nil {
		return err
	}
	h.pods = m
	close(h.changed)
	h.changed = make(chan struct{})
	return nil
}

func (h *hub) run(ctx context.Context, events chan<- Event) error {
	seen := map[string]Pod{}
	cur, wake := h.snapshot()
	send := func(ev Event) error {
		select {
		case events <- ev:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, ev := range diff(seen, cur) {
		if err := send(ev); err != nil {
			return err
		}
	}
	seen = cur
	if err := send(Event{Kind: Synced}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		}
		cur, wake = h.snapshot()
		for _, ev := range diff(seen, cur) {
			if err := send(ev); err != nil {
				return err
			}
		}
		seen = cur
	}
}

// Memory is a Source whose pods are set by calls: tests and `egret run`
// use it. Safe for concurrent use; any number of Runs may watch it.
type Memory struct{ h *hub }

var _ Source = (*Memory)(nil)

// NewMemory returns a Memory source holding pods.
func NewMemory(pods ...Pod) (*Memory, error) {
	m := &Memory{h: newHub()}
	for _, p := range pods {
		if err := m.Put(p); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Put adds p or replaces the pod of the same name.
func (m *Memory) Put(p Pod) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return m.h.update(func(pods map[string]Pod) error {
		pods[p.Name] = p
		return nil
	})
}

// Remove removes the pod called name.
func (m *Memory) Remove(name string) error {
	return m.h.update(func(pods map[string]Pod) error {
		if _, ok := pods[name]; !ok {
			return fmt.Errorf("pods: no pod %q", name)
		}
		delete(pods, name)
		return nil
	})
}

// Pods returns the current pods.
func (m *Memory) Pods() map[string]Pod {
	p, _ := m.h.snapshot()
	return p
}

// Run implements Source.
func (m *Memory) Run(ctx context.Context, events chan<- Event) error {
	return m.h.run(ctx, events)
}
