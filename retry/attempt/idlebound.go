package attempt

import "time"

// IdleBoundSource says where an upstream's idle bound was learned.
type IdleBoundSource uint8

const (
	// IdleBoundNone: nothing learned; any pooled connection that passes
	// the liveness check may carry the request.
	IdleBoundNone IdleBoundSource = iota
	// IdleBoundKeepAlive: the upstream's `Keep-Alive: timeout=N`.
	IdleBoundKeepAlive
	// IdleBoundClose: the upstream was seen to close (or reset) a
	// connection idle that long.
	IdleBoundClose
)

func (s IdleBoundSource) String() string {
	switch s {
	case IdleBoundKeepAlive:
		return "keep-alive timeout"
	case IdleBoundClose:
		return "close seen"
	}
	return "none"
}

// IdleBound is what the pool knew of an upstream's idle timeout when an
// attempt took its connection.
type IdleBound struct {
	// Limit: a connection idle this long or longer does not carry a
	// request that is not safely idempotent (0 with Source none).
	Limit time.Duration
	// Seen is what it was learned from: the declared timeout, or the
	// idle time after which a close was seen.
	Seen   time.Duration
	Source IdleBoundSource
}
