package spool

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Source is where a request body's bytes come from and how reading them
// is bounded: R is the body (its framing decoded), Conn what its reads
// wait on (the client connection, or an HTTP/2 stream's
// http.ResponseController), Each the deadline of each read, Until the end
// of them all; once Cut is set (the proxy's shutdown, which then sets a
// deadline in the past on Conn) every read ends at once.
type Source struct {
	R     io.Reader
	Conn  Deadliner
	Each  time.Duration
	Until time.Time
	Cut   *atomic.Bool
}

// Deadliner sets the deadline of the reads of a body's source.
type Deadliner interface{ SetReadDeadline(time.Time) error }

// ErrDetached: the body's source was taken back (Detach).
var ErrDetached = errors.New("spool: body detached from its source")

// Read holds the body of src as New does, its reads bounded as src says;
// the body's Detach takes the source back from a one-shot body the
// transport may still be reading.
func Read(src Source, contentLength int64, lim Limits) (*Body, error) {
	g := newGuard(src)
	b, err := New(g, contentLength, lim)
	if b != nil {
		b.g = g
	}
	return b, err
}

// ReadStream is NewStream of src, its reads bounded as src says.
func ReadStream(src Source, memory int64) *Body {
	g := newGuard(src)
	b := NewStream(g, memory)
	b.g = g
	return b
}

// Detach stops the reads of the body's source and returns once none is
// in progress: after it no read touches the source again, whoever holds
// the body. A read blocked on the client is ended by a deadline in the
// past, set after stop, and each read checks stop after setting its own
// deadline, so whichever comes last is the one in the past (the pattern
// the proxy's shutdown uses). Detach waits for that read on the guard's
// lock, not on a clock. A body not made by Read or ReadStream has nothing
// to detach.
func (b *Body) Detach() {
	if b.g != nil {
		b.g.detach()
	}
}

// aLongTimeAgo is a deadline in the past: it ends a blocked read at once.
var aLongTimeAgo = time.Unix(1, 0)

// guard serialises the reads of a source with detach, and gives each read
// its deadline.
type guard struct {
	src  Source
	mu   sync.Mutex
	stop atomic.Bool
}

func newGuard(src Source) *guard { return &guard{src: src} }

func (g *guard) Read(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stop.Load() {
		return 0, ErrDetached
	}
	s := &g.src
	d := time.Now().Add(s.Each)
	if !s.Until.IsZero() && s.Until.Before(d) {
		d = s.Until
	}
	s.Conn.SetReadDeadline(d)
	// Checked after the deadline is set: the shutdown sets Cut (detach
	// sets stop) and then a deadline in the past, so one of the two ends
	// this read.
	if s.Cut != nil && s.Cut.Load() || g.stop.Load() {
		s.Conn.SetReadDeadline(aLongTimeAgo)
	}
	return s.R.Read(p)
}

func (g *guard) detach() {
	g.stop.Store(true)
	g.src.Conn.SetReadDeadline(aLongTimeAgo)
	g.mu.Lock()
	g.mu.Unlock()
}
