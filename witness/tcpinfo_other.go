//go:build !linux

package witness

import "syscall"

// Snapshot is unsupported outside Linux.
func (TCPInfo) Snapshot(syscall.RawConn) (Counters, error) {
	return Counters{}, ErrUnsupported
}
