package proxy

import (
	"sync"

	"github.com/egret-proxy/egret/proxy/policy"
)

// Overlay is a PolicySource for one pod: the node's policy (Base, usually a
// *policy.Watcher) with the pod's override laid over it (policy.Overlay).
// When the node's policy is reloaded the overlay is rebuilt on the next
// request; if the new combination is refused, the last good one stays in
// force and OnError is told. Safe for concurrent use.
type Overlay struct {
	base     PolicySource
	name     string
	override []byte
	// OnError, when set, is called with the error of a refused rebuild.
	OnError func(error)

	mu      sync.Mutex
	from    *policy.Policy // the base the current overlay was built on
	current *policy.Policy
}

// NewOverlay builds the pod's policy now, so that a bad override is refused
// when the pod is added rather than at its first request.
func NewOverlay(base PolicySource, name string, override []byte) (*Overlay, error) {
	o := &Overlay{base: base, name: name, override: append([]byte(nil), override...)}
	b := base.Current()
	p, err := policy.Overlay(b, name, o.override)
	if err != nil {
		return nil, err
	}
	o.from, o.current = b, p
	return o, nil
}

// Current returns the pod's policy over the node's policy in force.
func (o *Overlay) Current() *policy.Policy {
	b := o.base.Current()
	o.mu.Lock()
	defer o.mu.Unlock()
	if b == o.from {
		return o.current
	}
	p, err := policy.Overlay(b, o.name, o.override)
	o.from = b // try a refused combination once, not on every request
	if err != nil {
		if o.OnError != nil {
			o.OnError(err)
		}
		return o.current
	}
	o.current = p
	return p
}

var _ PolicySource = (*Overlay)(nil)
