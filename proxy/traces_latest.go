package proxy

import (
	"slices"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry"
)

// Latest returns copies of the n most recent traces whose outcome is one
// of outcomes (any outcome if none is given), newest first. Only those
// are copied: a summary polled every second reads a full store cheaply.
func (t *Traces) Latest(n int, outcomes ...engine.Outcome) []retry.Trace {
	t.mu.Lock()
	defer t.mu.Unlock()
	held := len(t.ring)
	var out []retry.Trace
	// The newest is just before next (when full) or last (before).
	for k := held - 1; k >= 0 && len(out) < n; k-- {
		tr := &t.ring[(t.next+k)%held]
		if len(outcomes) > 0 && !slices.Contains(outcomes, tr.Outcome) {
			continue
		}
		c := *tr
		c.Attempts = append([]retry.Attempt(nil), tr.Attempts...)
		out = append(out, c)
	}
	return out
}
