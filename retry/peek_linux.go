//go:build linux

package retry

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// peerClosed reports whether the peer already closed the socket (a
// non-blocking MSG_PEEK reads end of stream), or left bytes nobody asked
// for (an idle HTTP/1.1 connection has no business holding any).
func peerClosed(raw syscall.RawConn) bool {
	var closed bool
	var b [1]byte
	raw.Control(func(fd uintptr) {
		// n == 0 is a FIN, n > 0 unsolicited bytes, EAGAIN a live idle
		// connection, any other error a dead one.
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		closed = err != unix.EAGAIN && err != unix.EINTR
	})
	return closed
}
