// Package spool holds an HTTP request body so that it can be sent again:
// in memory up to one limit (engine.BodyReplayable), in a temporary file up
// to a larger one (engine.BodyReopenable), and beyond that as the original
// stream, readable once (engine.BodyOneShot).
//
// A body whose length is known is classified by its Content-Length before a
// byte of it is read, so a huge upload is never read ahead only to be found
// one-shot. A body of unknown length (chunked) is read into memory, then
// into the file, and when it outgrows the spool limit it becomes one-shot:
// the spooled part followed by the rest of the stream.
package spool

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/egret-proxy/egret/engine"
)

// Errors of this package; match them with errors.Is.
var (
	// ErrShortBody: the stream ended before its declared length.
	ErrShortBody = errors.New("spool: body shorter than its Content-Length")
	// ErrClosed: the body was read after Close.
	ErrClosed = errors.New("spool: body closed")
	// ErrNotReplayable: Reopen on a one-shot body.
	ErrNotReplayable = errors.New("spool: body is one-shot")
)

// Limits say where a body is held. A body of at most Memory bytes stays in
// memory; one of at most Spool bytes goes to a temporary file in Dir (the
// system's default when empty); a larger one is streamed once. Spool below
// Memory means no spooling. The proxy takes them from the upstream's policy
// (policy.BodyLimits, whose defaults are policy.DefaultMemoryLimit and
// DefaultSpoolLimit).
type Limits struct {
	Memory int64
	Spool  int64
	Dir    string
}

// Body is a request body held by this package. It is an io.ReadCloser for
// the first dispatch; Reopen gives a fresh reader from the start for a
// replayable or reopenable body. Close releases it (the temporary file is
// removed). Read and Close are safe to call from different goroutines, as
// http.Transport does.
type Body struct {
	kind engine.Body
	mem  []byte
	file *os.File
	size int64 // bytes held (mem or file); -1 unknown for a one-shot stream

	// r is the first dispatch's reader; one goroutine reads it at a time
	// (the transport's writer). The flags are atomic so that Done and
	// Release never wait for a read blocked on the client.
	r      io.Reader
	st     *stream // a NewStream body's state; nil otherwise
	g      *guard  // the source's guard (Read, ReadStream); nil otherwise
	eof    atomic.Bool
	closed atomic.Bool
	mu     sync.Mutex // serialises Reopen and Release
}

// New reads src according to its declared length: contentLength >= 0 is the
// Content-Length, -1 means unknown (chunked). src must end at the end of the
// body (a chunked decoder, or a reader limited to the Content-Length). A
// one-shot Body keeps reading src when it is read.
func New(src io.Reader, contentLength int64, lim Limits) (*Body, error) {
	if lim.Spool < lim.Memory {
		lim.Spool = lim.Memory
	}
	switch {
	case contentLength == 0:
		return &Body{kind: engine.BodyNone, r: bytes.NewReader(nil)}, nil
	case contentLength > 0 && contentLength <= lim.Memory:
		buf := make([]byte, contentLength)
		if _, err := io.ReadFull(src, buf); err != nil {
			return nil, shortErr(err)
		}
		return memBody(buf), nil
	case contentLength > 0 && contentLength <= lim.Spool:
		f, err := tempFile(lim.Dir)
		if err != nil {
			return nil, err
		}
		n, err := io.Copy(f, io.LimitReader(src, contentLength))
		if err == nil && n < contentLength {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			discard(f)
			return nil, shortErr(err)
		}
		return fileBody(f, n), nil
	case contentLength > 0:
		return &Body{kind: engine.BodyOneShot, size: contentLength, r: src}, nil
	}
	return readUnknown(src, lim)
}

// readUnknown holds a body of unknown length: memory, then file, then the
// spooled part followed by the rest of src.
func readUnknown(src io.Reader, lim Limits) (*Body, error) {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(src, lim.Memory+1))
	if err != nil {
		return nil, err
	}
	if n <= lim.Memory {
		if n == 0 {
			return &Body{kind: engine.BodyNone, r: bytes.NewReader(nil)}, nil
		}
		return memBody(buf.Bytes()), nil
	}
	f, err := tempFile(lim.Dir)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(buf.Bytes()); err != nil {
		discard(f)
		return nil, err
	}
	m, err := io.Copy(f, io.LimitReader(src, lim.Spool+1-n))
	if err != nil {
		discard(f)
		return nil, err
	}
	if n+m <= lim.Spool {
		return fileBody(f, n+m), nil
	}
	// Too big to keep: what was spooled, then the rest, once.
	return &Body{
		kind: engine.BodyOneShot,
		file: f,
		size: -1,
		r:    io.MultiReader(io.NewSectionReader(f, 0, n+m), src),
	}, nil
}

func memBody(b []byte) *Body {
	return &Body{kind: engine.BodyReplayable, mem: b, size: int64(len(b)), r: bytes.NewReader(b)}
}

func fileBody(f *os.File, n int64) *Body {
	return &Body{kind: engine.BodyReopenable, file: f, size: n, r: io.NewSectionReader(f, 0, n)}
}

// tempFile creates the spool file and, where the system allows it, removes
// its name at once: the open file stays readable, and nothing is left
// behind even if the process is killed.
func tempFile(dir string) (*os.File, error) {
	f, err := os.CreateTemp(dir, "egret-body-*")
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	_ = os.Remove(f.Name())
	return f, nil
}

func discard(f *os.File) {
	_ = f.Close()
	_ = os.Remove(f.Name())
}

func shortErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %w", ErrShortBody, err)
	}
	return err
}

// BodyKind reports the body's replayability for the retry engine.
func (b *Body) BodyKind() engine.Body {
	if b.st != nil && b.st.over.Load() {
		return engine.BodyOneShot
	}
	return b.kind
}

// Len is the number of bytes of the body when known, else -1. A one-shot
// body of known Content-Length reports it.
func (b *Body) Len() int64 {
	if b.kind == engine.BodyNone {
		return 0
	}
	return b.size
}

// Path is the temporary file's name, "" when the body is not spooled. On
// Unix the name is removed as soon as the file is created.
func (b *Body) Path() string {
	if b.file == nil {
		return ""
	}
	return b.file.Name()
}

// Read reads the first dispatch of the body.
func (b *Body) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, ErrClosed
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

// Done reports whether the first dispatch's reader reached the end of the
// body, i.e. nothing of the client's stream is left unread.
func (b *Body) Done() bool {
	if b.st != nil {
		return b.st.eof.Load()
	}
	return b.kind != engine.BodyOneShot || b.eof.Load()
}

// Reopen returns a new reader of the whole body, for another attempt (it
// fits http.Request.GetBody). It fails with ErrNotReplayable on a one-shot
// body and ErrClosed after Close.
func (b *Body) Reopen() (io.ReadCloser, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed.Load():
		return nil, ErrClosed
	case b.kind == engine.BodyOneShot:
		return nil, ErrNotReplayable
	case b.st != nil:
		return b.st.reopen(b)
	case b.file != nil:
		return &reopened{b: b, r: io.NewSectionReader(b.file, 0, b.size)}, nil
	}
	return io.NopCloser(bytes.NewReader(b.mem)), nil
}

// reopened reads a spooled file and fails once the body is released.
type reopened struct {
	b *Body
	r io.Reader
}

func (r *reopened) Read(p []byte) (int, error) {
	if r.b.closed.Load() {
		return 0, ErrClosed
	}
	return r.r.Read(p)
}

func (r *reopened) Close() error { return nil }

// Close does nothing: the transport closes a request body when it is done
// with one attempt, and another attempt may still Reopen it. Release frees
// it once the request has been answered.
func (b *Body) Close() error { return nil }

// Release ends the body's life: Read and Reopen fail and the temporary file
// is removed. It is called once the request has been answered.
func (b *Body) Release() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Swap(true) {
		return nil
	}
	if b.file != nil {
		err := b.file.Close()
		if rerr := os.Remove(b.file.Name()); err == nil && !errors.Is(rerr, os.ErrNotExist) {
			err = rerr
		}
		return err
	}
	return nil
}

var _ io.ReadCloser = (*Body)(nil)
