//go:build !linux

package rawsock

import (
	"net"
	"syscall"
)

// Wrap returns c: raw socket calls are made on Linux only.
func Wrap(c net.Conn) net.Conn { return c }

// Read is read(2) on fd, for code that reads inside a syscall.RawConn's
// Read. EINTR is retried.
func Read(fd uintptr, p []byte) (int, error) {
	for {
		n, err := syscall.Read(int(fd), p)
		if err != syscall.EINTR {
			return n, err
		}
	}
}
