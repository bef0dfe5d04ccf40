package cli

import (
	"io"
	"sync"
	"time"
)

// logWriter buffers log lines and writes them out in batches: at most
// logFlushEvery after the first line of a batch, when the buffer is full,
// and on Close. One write(2) per request line was a tenth of the proxy's
// CPU under load.
//
// A batch is written out of the lock that lines are added under, from a
// buffer of its own, so that a write that stalls (a file's page under
// writeback, a slow pipe) does not hold up the requests logging meanwhile;
// they fill the next buffer. Nothing is dropped and the order is kept: a
// full buffer waits for the batch before it to be written, and is then
// written by the writer that filled it.
type logWriter struct {
	mu      sync.Mutex // guards buf, pending, closed
	buf     []byte     // lines not yet taken for writing
	pending bool       // a timed flush is scheduled
	closed  bool

	// out is written under wmu, which is taken under mu (never the other
	// way round) so that batches go out in the order they were taken.
	wmu   sync.Mutex
	out   io.Writer
	spare []byte // the last batch's buffer, for the next one (guarded by wmu)
}

const (
	logBufferSize = 64 << 10
	logFlushEvery = 50 * time.Millisecond
)

func newLogWriter(out io.Writer) *logWriter {
	return &logWriter{out: out, buf: make([]byte, 0, logBufferSize), spare: make([]byte, 0, logBufferSize)}
}

// Write takes one log record (slog handlers write each record in one call).
// An error is that of writing out a batch, if this call wrote one.
func (l *logWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.wmu.Lock()
		defer l.wmu.Unlock()
		return l.out.Write(p)
	}
	l.buf = append(l.buf, p...)
	if len(l.buf) >= logBufferSize {
		b := l.takeLocked()
		l.mu.Unlock()
		if err := l.writeOut(b); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	if !l.pending {
		l.pending = true
		time.AfterFunc(logFlushEvery, l.flush)
	}
	l.mu.Unlock()
	return len(p), nil
}

// takeLocked, with mu held, waits for the batch before to be written out,
// takes the buffered lines and leaves an empty buffer; the caller writes
// them with writeOut after unlocking mu.
func (l *logWriter) takeLocked() []byte {
	l.wmu.Lock()
	b := l.buf
	l.buf, l.spare = l.spare[:0], nil
	return b
}

// writeOut writes a batch taken by takeLocked and releases wmu.
func (l *logWriter) writeOut(b []byte) error {
	defer l.wmu.Unlock()
	var err error
	if len(b) > 0 {
		_, err = l.out.Write(b)
	}
	if cap(b) <= 2*logBufferSize { // one line may have made a batch larger
		l.spare = b[:0]
	}
	return err
}

func (l *logWriter) flush() {
	l.mu.Lock()
	l.pending = false
	if l.closed || len(l.buf) == 0 {
		l.mu.Unlock()
		return
	}
	b := l.takeLocked()
	l.mu.Unlock()
	_ = l.writeOut(b)
}

// Close writes out what is buffered; later writes go straight through.
func (l *logWriter) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	b := l.takeLocked()
	l.mu.Unlock()
	return l.writeOut(b)
}
