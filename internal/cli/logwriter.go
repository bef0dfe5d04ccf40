package cli

import (
	"bufio"
	"io"
	"sync"
	"time"
)

// logWriter buffers log lines and writes them out in batches: at most
// logFlushEvery after the first line of a batch, when the buffer is full,
// and on Close. One write(2) per request line was a tenth of the proxy's
// CPU under load. Nothing is dropped: a full buffer is written out before
// more is taken, by the writer that filled it.
type logWriter struct {
	mu      sync.Mutex
	out     io.Writer
	w       *bufio.Writer
	pending bool // a flush is scheduled
	closed  bool
}

const (
	logBufferSize = 64 << 10
	logFlushEvery = 50 * time.Millisecond
)

func newLogWriter(out io.Writer) *logWriter {
	return &logWriter{out: out, w: bufio.NewWriterSize(out, logBufferSize)}
}

// Write takes one log record (slog handlers write each record in one call).
func (l *logWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.out.Write(p)
	}
	n, err := l.w.Write(p)
	if !l.pending && l.w.Buffered() > 0 {
		l.pending = true
		time.AfterFunc(logFlushEvery, l.flush)
	}
	return n, err
}

func (l *logWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = false
	l.w.Flush()
}

// Close writes out what is buffered; later writes go straight through.
func (l *logWriter) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	return l.w.Flush()
}
