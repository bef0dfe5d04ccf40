package spool

import (
	"io"
	"sync"
	"sync/atomic"

	"github.com/egret-proxy/egret/engine"
)

// NewStream holds a body of unknown length that must go upstream as it
// comes, never read ahead: a stream whose client may wait for the first
// part of the answer before it sends the rest (an HTTP/2 stream, such as a
// gRPC call streaming both ways). The first dispatch reads src as the
// upstream takes it and keeps what it read, up to memory bytes, so that
// Reopen can replay it for a retry (the rest still coming from src, as it
// comes). Once more than memory bytes were read the kept part is dropped:
// from then on BodyKind says one-shot and Reopen fails with
// ErrNotReplayable, as gRPC and Linkerd buffer a call for retries only up
// to a limit.
//
// The engine may have been told replayable before the body outgrew
// memory; the Reopen of its retry then fails, and the run ends with what
// the attempt's evidence says, never with a body sent in part.
func NewStream(src io.Reader, memory int64) *Body {
	s := &stream{src: src, mem: memory}
	b := &Body{kind: engine.BodyReplayable, size: -1, st: s}
	b.r = &streamReader{s: s, b: b}
	return b
}

// stream is the state of a NewStream body: what was read of src so far
// (n bytes, the first of them kept in buf while they fit in mem).
//
// rmu serialises the reads of src; mu guards what was read. A reader
// behind the others reads buf under mu alone, so that a retry's reader
// replays what is kept even while an earlier attempt's reader (the
// transport may still hold one that it has yet to close) waits on src.
// What that read brings is kept as any other, so nothing of src is lost
// between readers.
type stream struct {
	src io.Reader
	mem int64
	rmu sync.Mutex

	mu   sync.Mutex
	buf  []byte
	n    int64
	over atomic.Bool // more than mem bytes were read: buf is gone
	eof  atomic.Bool
	err  error // src's error other than io.EOF, returned to every reader
}

// streamReader is one dispatch's reader of a stream, from its start.
type streamReader struct {
	s      *stream
	b      *Body
	pos    int64
	closed atomic.Bool
}

func (r *streamReader) Read(p []byte) (int, error) {
	if r.closed.Load() || r.b.closed.Load() {
		return 0, ErrClosed
	}
	if n, err, ok := r.kept(p); ok {
		return n, err
	}
	s := r.s
	s.rmu.Lock()
	defer s.rmu.Unlock()
	// Another reader may have read src meanwhile: what it read is kept.
	if n, err, ok := r.kept(p); ok {
		return n, err
	}
	if r.closed.Load() {
		return 0, ErrClosed
	}
	n, err := s.src.Read(p)
	s.mu.Lock()
	if n > 0 {
		if !s.over.Load() && s.n+int64(n) <= s.mem {
			s.buf = append(s.buf, p[:n]...)
		} else {
			s.over.Store(true)
			s.buf = nil
		}
		s.n += int64(n)
		r.pos += int64(n)
	}
	switch {
	case err == io.EOF:
		s.eof.Store(true)
	case err != nil:
		s.err = err
	}
	s.mu.Unlock()
	return n, err
}

// kept reads what was already read of src, if r is behind it (ok), or
// src's end or error once r has read all there will be.
func (r *streamReader) kept(p []byte) (n int, err error, ok bool) {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case r.pos < s.n && s.over.Load():
		return 0, ErrNotReplayable, true
	case r.pos < s.n:
		n = copy(p, s.buf[r.pos:])
		r.pos += int64(n)
		return n, nil, true
	case s.eof.Load():
		return 0, io.EOF, true
	case s.err != nil:
		return 0, s.err, true
	}
	return 0, nil, false
}

// Close ends this reader: a read it has yet to make fails, and src is
// left to the next one.
func (r *streamReader) Close() error {
	r.closed.Store(true)
	return nil
}

// reopen is Reopen of a stream body.
func (s *stream) reopen(b *Body) (io.ReadCloser, error) {
	if s.over.Load() {
		return nil, ErrNotReplayable
	}
	return &streamReader{s: s, b: b}, nil
}
