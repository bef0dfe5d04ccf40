package agent

import (
	"errors"
	"syscall"

	"github.com/egret-proxy/egret/witness"
)

// fallbackWitness asks the eBPF witness first and TCP_INFO when the eBPF
// witness does not track the socket (it was connected before egret's
// cgroup was attached, or without the mark).
type fallbackWitness struct {
	primary, fallback witness.Witness
}

var _ witness.Witness = fallbackWitness{}

func (w fallbackWitness) Snapshot(c syscall.RawConn) (witness.Counters, error) {
	ctr, err := w.primary.Snapshot(c)
	if err == nil || !errors.Is(err, witness.ErrUnsupported) || w.fallback == nil {
		return ctr, err
	}
	return w.fallback.Snapshot(c)
}
