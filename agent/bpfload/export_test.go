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

// FlowsMemlock is the kernel's memory accounting of egret_flows (for the
// map memory per pod).
func (l *Loader) FlowsMemlock() uint64 {
	info, err := l.objs.EgretFlows.Info()
	if err != nil {
		return 0
	}
	n, _ := info.Memlock()
	return n
}
