package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// closeWriter is a connection that can half-close its sending side.
type closeWriter interface{ CloseWrite() error }

// pipe copies bytes both ways between a and b until both directions end,
// half-closing each side's writing end when the other side's reading end is
// done, so that protocols which rely on a half-close keep working. prefixA
// is sent to b first: bytes already read from a (sniffed or buffered).
// It returns the bytes copied a→b (prefix included) and b→a.
func pipe(a io.ReadWriteCloser, b io.ReadWriteCloser, prefixA []byte) (aToB, bToA int64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var err error
		bToA, err = io.Copy(a, b)
		if err != nil { // a reset or a failed write: end both ways
			a.Close()
			b.Close()
			return
		}
		halfClose(a)
	}()
	if len(prefixA) > 0 {
		n, err := b.Write(prefixA)
		aToB += int64(n)
		if err != nil {
			a.Close()
			b.Close()
			wg.Wait()
			return aToB, bToA
		}
	}
	n, err := io.Copy(b, a)
	aToB += n
	if err != nil {
		a.Close()
		b.Close()
	} else {
		halfClose(b)
	}
	wg.Wait()
	a.Close()
	b.Close()
	return aToB, bToA
}

func halfClose(c io.Closer) {
	if cw, ok := c.(closeWriter); ok {
		if cw.CloseWrite() == nil {
			return
		}
	}
	c.Close()
}

// bufferedConn is a net.Conn whose first reads come from the bytes the
// proxy already buffered while sniffing or parsing.
type bufferedConn struct {
	net.Conn
	r io.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the underlying connection when it can.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// idleClock ends a tunnel that has been silent both ways for d: each side's
// reads wait at most d past the last byte either side read, so a long
// one-way download is not cut because its other direction is quiet.
type idleClock struct {
	d    time.Duration
	last atomic.Int64 // unix nanoseconds of the last byte read either way
}

func newIdleClock(d time.Duration) *idleClock {
	c := &idleClock{d: d}
	c.last.Store(time.Now().UnixNano())
	return c
}

// deadlineRW is one side of a tunnel: a connection, or an upgraded
// upstream connection (a 101 response's body).
type deadlineRW interface {
	io.ReadWriteCloser
	SetReadDeadline(time.Time) error
}

// wrap returns c with its reads under the clock.
func (k *idleClock) wrap(c deadlineRW) *idleConn { return &idleConn{Conn: c, k: k} }

// idleConn is one side of a tunnel whose reads the idleClock bounds.
type idleConn struct {
	Conn deadlineRW
	k    *idleClock
}

func (c *idleConn) Write(p []byte) (int, error) { return c.Conn.Write(p) }
func (c *idleConn) Close() error                { return c.Conn.Close() }

func (c *idleConn) Read(p []byte) (int, error) {
	for {
		c.Conn.SetReadDeadline(time.Unix(0, c.k.last.Load()).Add(c.k.d))
		n, err := c.Conn.Read(p)
		if n > 0 {
			c.k.last.Store(time.Now().UnixNano())
			return n, nil
		}
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) &&
			time.Since(time.Unix(0, c.k.last.Load())) < c.k.d {
			continue // the other direction spoke meanwhile
		}
		return n, err
	}
}

// CloseWrite half-closes the underlying connection when it can.
func (c *idleConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
