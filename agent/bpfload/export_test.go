package bpfload

import "syscall"

// RecordViaLibrary reads the record through cilium/ebpf's Map.Lookup, for
// the raw lookup's differential test.
func (w *Witness) RecordViaLibrary(c syscall.RawConn) (Record, error) {
	lib := *w
	lib.raw = false
	return lib.Record(c)
}

// RawLookup reports whether Record makes its lookup as a raw system call.
func (w *Witness) RawLookup() bool { return w.raw }
