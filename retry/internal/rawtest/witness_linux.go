package rawtest

import (
	"sync/atomic"
	"syscall"

	"github.com/egret-proxy/egret/witness"
)

// CountingWitness is witness.TCPInfo that counts its snapshots.
type CountingWitness struct{ n atomic.Int64 }

// Snapshot is witness.TCPInfo's, counted.
func (w *CountingWitness) Snapshot(c syscall.RawConn) (witness.Counters, error) {
	w.n.Add(1)
	return witness.TCPInfo{}.Snapshot(c)
}

// Snapshots is the number of snapshots taken so far.
func (w *CountingWitness) Snapshots() int64 { return w.n.Load() }
