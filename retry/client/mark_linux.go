//go:build linux

package client

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// setMark sets SO_MARK on the socket before it connects.
func setMark(c syscall.RawConn, mark int) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark)
	}); err != nil {
		return err
	}
	return serr
}
