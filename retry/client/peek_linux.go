//go:build linux

package client

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// peeker peeks at an idle socket without blocking. One is made per
// connection, so that a peek allocates nothing (a closure or a source
// address per call would).
type peeker struct {
	buf          [1]byte
	fin, pending bool
	fn           func(fd uintptr)
}

func newPeeker() *peeker {
	p := &peeker{}
	p.fn = p.peek
	return p
}

func (p *peeker) peek(fd uintptr) {
	n, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p.buf[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	switch {
	case errno == unix.EAGAIN || errno == unix.EINTR:
	case errno != 0 || n == 0:
		p.fin = true
	default:
		p.pending = true
	}
}

// state tells whether the peer closed the socket (end of stream, or an
// error such as a reset: fin) or left bytes nobody asked for (pending).
func (p *peeker) state(raw syscall.RawConn) (fin, pending bool) {
	p.fin, p.pending = false, false
	if raw.Control(p.fn) != nil {
		return true, false // closed on our side
	}
	return p.fin, p.pending
}
