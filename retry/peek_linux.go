//go:build linux

package retry

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// peerState peeks at an idle socket without blocking: fin says the peer
// closed it (end of stream, or an error such as a reset), pending that it
// left bytes nobody asked for.
func peerState(raw syscall.RawConn) (fin, pending bool) {
	var b [1]byte
	raw.Control(func(fd uintptr) {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
		case err != nil || n == 0:
			fin = true
		default:
			pending = true
		}
	})
	return fin, pending
}
