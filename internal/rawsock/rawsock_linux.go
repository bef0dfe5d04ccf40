//go:build linux

package rawsock

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// Conn is a TCP connection whose reads and writes are raw system calls on
// its non-blocking socket, made through its syscall.RawConn: Go's poller
// still waits for readiness and keeps deadlines and Close as net.Conn does.
// Everything else is the *net.TCPConn's.
type Conn struct {
	*net.TCPConn
	rc syscall.RawConn

	rmu  sync.Mutex
	rd   op
	rfn  func(uintptr) bool
	wmu  sync.Mutex
	wr   op
	wfn  func(uintptr) bool
	addr [2]net.Addr // local, remote (for errors)
}

// op is one read or write in progress.
type op struct {
	p   []byte
	n   int
	err syscall.Errno
}

var _ net.Conn = (*Conn)(nil)

// Wrap returns c as a *Conn when it is a *net.TCPConn; anything else
// (TLS, a pipe, a Unix socket) is returned as it is.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	x := &Conn{TCPConn: tc, rc: rc, addr: [2]net.Addr{tc.LocalAddr(), tc.RemoteAddr()}}
	x.rfn, x.wfn = x.readFD, x.writeFD
	return x
}

func (c *Conn) readFD(fd uintptr) bool {
	n, err := Read(fd, c.rd.p)
	switch {
	case err == nil:
		c.rd.n = n
	case err == syscall.EAGAIN:
		return false
	default:
		c.rd.err = err.(syscall.Errno)
	}
	return true
}

func (c *Conn) writeFD(fd uintptr) bool {
	for c.wr.n < len(c.wr.p) {
		p := c.wr.p[c.wr.n:]
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			c.wr.n += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.wr.err = e
			return true
		}
	}
	return true
}

// Read reads as net.Conn's Read does: io.EOF at the end of the stream, a
// *net.OpError otherwise.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return c.TCPConn.Read(p)
	}
	n, err := c.do(false, p)
	switch {
	case err != nil:
		return 0, err
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p, as net.Conn's Write does, or fails with a
// *net.OpError after the bytes it wrote.
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return c.TCPConn.Write(p)
	}
	return c.do(true, p)
}

// do runs one read or write of p through the RawConn (one of each at a
// time, as net.Conn allows).
func (c *Conn) do(write bool, p []byte) (int, error) {
	mu, o, name := &c.rmu, &c.rd, "read"
	if write {
		mu, o, name = &c.wmu, &c.wr, "write"
	}
	mu.Lock()
	*o = op{p: p}
	var err error
	if write {
		err = c.rc.Write(c.wfn)
	} else {
		err = c.rc.Read(c.rfn)
	}
	n, e := o.n, o.err
	o.p = nil
	mu.Unlock()
	switch {
	case err != nil:
		return n, c.opError(name, rawErr(err))
	case e != 0:
		return n, c.opError(name, os.NewSyscallError(name, e))
	}
	return n, nil
}

// rawErr is the poller's error inside the RawConn's *net.OpError
// (net.ErrClosed, os.ErrDeadlineExceeded).
func rawErr(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Err
	}
	return err
}

func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.addr[0], Addr: c.addr[1], Err: err}
}

// Read is read(2) on fd as a raw system call, for code that reads inside
// a syscall.RawConn's Read: (0, nil) at the end of the stream, EAGAIN when
// nothing is there yet; an error is always a syscall.Errno. EINTR is
// retried.
func Read(fd uintptr, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			return int(n), nil
		case syscall.EINTR:
		default:
			return -1, e
		}
	}
}
