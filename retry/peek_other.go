//go:build !linux

package retry

import "syscall"

// peerClosed cannot tell outside Linux: it says no.
func peerClosed(syscall.RawConn) bool { return false }
