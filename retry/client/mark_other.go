//go:build !linux

package client

import (
	"errors"
	"syscall"
)

// setMark is unsupported outside Linux.
func setMark(syscall.RawConn, int) error { return errors.New("SO_MARK needs Linux") }
