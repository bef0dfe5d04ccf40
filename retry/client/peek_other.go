//go:build !linux

package client

import "syscall"

// peeker cannot tell outside Linux: it says nothing happened.
type peeker struct{}

func newPeeker() *peeker { return &peeker{} }

func (*peeker) state(syscall.RawConn) (fin, pending bool) { return false, false }
