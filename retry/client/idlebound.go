package client

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/egret-proxy/egret/retry/attempt"
)

// A request that is not safely idempotent must not be risked on a pooled
// connection the upstream may be closing: when the upstream reset it as
// the request arrived, nothing the kernel says afterwards tells "never
// read" from "read, then reset" (the ACK a RST carries is not processed,
// and a server's delayed ACK has often not left yet), so the answer would
// be ambiguous. idleBounds learns, per upstream, how long a connection may
// have been idle and still be trusted with such a request; the pool gives
// it only connections idle for less, and a fresh one otherwise.

const (
	// maxIdleBounds bounds the upstreams remembered; past it an arbitrary
	// one is forgotten (its next close or Keep-Alive teaches it again).
	maxIdleBounds = 1024
	// closeMemory is how long a close seen is remembered: an upstream
	// that restarted once must not cost fresh connections for ever.
	closeMemory = 5 * time.Minute
)

type idleBounds struct {
	mu sync.Mutex
	m  map[poolKey]*idleEntry
}

type idleEntry struct {
	keepAlive time.Duration // declared timeout, 0 when none
	closedAt  time.Duration // shortest idle after which a close was seen
	closeSeen time.Time     // when (zero: none)
}

// bound returns the idle bound of key at now. The limit is three quarters
// of a declared timeout (the upstream's timer starts before ours, and its
// FIN takes time to arrive) and half of an idle time after which a close
// was seen (the close came at some point before it was seen); with both,
// the lower.
func (b *idleBounds) bound(key poolKey, now time.Time) attempt.IdleBound {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.m[key]
	if e == nil {
		return attempt.IdleBound{}
	}
	var out attempt.IdleBound
	if e.keepAlive > 0 {
		out = attempt.IdleBound{Limit: e.keepAlive * 3 / 4, Seen: e.keepAlive, Source: attempt.IdleBoundKeepAlive}
	}
	if !e.closeSeen.IsZero() {
		if now.Sub(e.closeSeen) > closeMemory {
			e.closedAt, e.closeSeen = 0, time.Time{}
		} else if l := e.closedAt / 2; out.Source == attempt.IdleBoundNone || l < out.Limit {
			out = attempt.IdleBound{Limit: l, Seen: e.closedAt, Source: attempt.IdleBoundClose}
		}
	}
	return out
}

// entryLocked returns key's entry, making room for it if needed.
func (b *idleBounds) entryLocked(key poolKey) *idleEntry {
	if e := b.m[key]; e != nil {
		return e
	}
	if b.m == nil {
		b.m = make(map[poolKey]*idleEntry)
	}
	if len(b.m) >= maxIdleBounds {
		for k := range b.m {
			delete(b.m, k)
			break
		}
	}
	e := &idleEntry{}
	b.m[key] = e
	return e
}

// keepAlive records the timeout a response's Keep-Alive field declares.
func (b *idleBounds) keepAlive(key poolKey, h http.Header) {
	v, ok := h["Keep-Alive"]
	if !ok {
		return
	}
	d, ok := keepAliveTimeout(v)
	if !ok {
		return
	}
	b.mu.Lock()
	b.entryLocked(key).keepAlive = d
	b.mu.Unlock()
}

// closed records that the upstream closed or reset a connection of key
// that had been idle for idle.
func (b *idleBounds) closed(key poolKey, idle time.Duration, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entryLocked(key)
	if e.closeSeen.IsZero() || now.Sub(e.closeSeen) > closeMemory || idle < e.closedAt {
		e.closedAt = idle
	}
	e.closeSeen = now
}

// keepAliveTimeout parses the timeout parameter of Keep-Alive field values
// ("timeout=5, max=100"); it must be a positive whole number of seconds.
func keepAliveTimeout(vs []string) (time.Duration, bool) {
	for _, v := range vs {
		for p := range strings.SplitSeq(v, ",") {
			name, val, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "timeout") {
				continue
			}
			n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(val), `"`))
			if err != nil || n <= 0 || n > 24*3600 {
				return 0, false
			}
			return time.Duration(n) * time.Second, true
		}
	}
	return 0, false
}
