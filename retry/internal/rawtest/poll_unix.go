//go:build unix

package rawtest

import (
	"fmt"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// WaitPeerFIN blocks until c's peer has closed its side (POLLRDHUP: the
// FIN, or a reset, is in c's socket) or 5 s pass, without reading from c.
func WaitPeerFIN(t *testing.T, c net.Conn) {
	t.Helper()
	if err := PollFor(c, unix.POLLRDHUP); err != nil {
		t.Fatalf("the peer's close: %v", err)
	}
}

// PollFIN is WaitPeerFIN for any goroutine.
func PollFIN(c net.Conn) error { return PollFor(c, unix.POLLRDHUP) }

// WaitPoll blocks until poll(2) reports one of events on c (or an error or
// hang-up) or 5 s pass.
func WaitPoll(t *testing.T, c net.Conn, events int16, what string) {
	t.Helper()
	if err := PollFor(c, events); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// PollFor is WaitPoll for any goroutine: it returns what went wrong.
func PollFor(c net.Conn, events int16) error {
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return err
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
		return err
	}
	if perr != nil {
		return perr
	}
	if n == 0 {
		return fmt.Errorf("nothing on the socket in 5 s")
	}
	return nil
}
