//go:build unix

package rawsock

import (
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Events for waitSocket.
const (
	pollIn    = unix.POLLIN
	pollRDHUP = unix.POLLRDHUP
)

// waitSocket blocks until poll(2) reports one of events on c (or an error
// or hang-up: a reset, a close), without reading from it, or fails after
// 5 s. It is how a test waits for the peer's bytes, FIN or RST to be in
// c's socket.
func waitSocket(t *testing.T, c net.Conn, events int16) {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var perr error
	if err := raw.Control(func(fd uintptr) {
		for {
			fds := []unix.PollFd{{Fd: int32(fd), Events: events}}
			if n, perr = unix.Poll(fds, 5000); perr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if perr != nil || n == 0 {
		t.Fatalf("poll: nothing on the socket in 5 s (%v)", perr)
	}
}
