package bpfload

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/bpf"
	"github.com/egret-proxy/egret/proxy/witness"
)

// Source is the Counters.Source of the eBPF witness.
const Source = "ebpf"

// Witness reads the kernel's record of one of egret's upstream sockets.
//
// Which sockets: those carrying the loader's SO_MARK when they connect, in
// a cgroup where AttachSelf put the sockops program (egret's own). The mark
// must be set before connect (net.Dialer.Control); sockets marked later,
// or connected before AttachSelf, are not tracked and Snapshot returns an
// error wrapping witness.ErrUnsupported, so the caller falls back to the
// TCP_INFO witness.
//
// How: sockops enrolls the socket at BPF_SOCK_OPS_TCP_CONNECT_CB (before
// the SYN) in an SK_STORAGE map and turns on the state, RTO, retransmit and
// header-option callbacks. The header-option callback runs for every
// segment the socket hands to IP, retransmissions included, and adds its
// payload length; the record therefore moves before any byte leaves. It
// counts a segment even if IP then fails to send it (no route, a netfilter
// drop), so it can only err toward "sent", never toward "not sent".
// tp_btf programs add resets (with their moment), retransmissions, state
// changes and the bytes accepted by sendmsg. Snapshot reads the record by
// the socket's fd and also reads TCP_INFO: the larger of the two counts is
// reported, so a transmission the hook could not see (the callback is
// skipped when a segment's TCP option space is already full, e.g. three
// SACK blocks plus timestamps) still counts. NotSentBytes (queued, not yet
// transmitted) comes from TCP_INFO, read live.
//
// On a kernel without these features Load fails and there is no Witness;
// the proxy keeps witness.TCPInfo.
type Witness struct {
	m *ebpf.Map
}

var _ witness.Witness = (*Witness)(nil)

// Witness returns the eBPF witness backed by this loader's maps.
func (l *Loader) Witness() *Witness { return &Witness{m: l.objs.EgretWitness} }

// Record is the raw per-socket record plus the socket's cookie.
type Record = bpf.EgretWitnessRec

// Record returns the raw kernel record of the socket behind c.
func (w *Witness) Record(c syscall.RawConn) (Record, error) {
	var (
		rec  Record
		lerr error
	)
	err := c.Control(func(fd uintptr) {
		lerr = w.m.Lookup(uint32(fd), &rec)
	})
	if err != nil {
		return rec, err
	}
	if lerr != nil {
		if errors.Is(lerr, ebpf.ErrKeyNotExist) || errors.Is(lerr, unix.ENOTSOCK) || errors.Is(lerr, unix.EOPNOTSUPP) {
			return rec, fmt.Errorf("%w: socket not tracked by the eBPF witness (no egret SO_MARK at connect, or egret's cgroup not attached)", witness.ErrUnsupported)
		}
		return rec, fmt.Errorf("bpfload: witness lookup: %w", lerr)
	}
	return rec, nil
}

// Snapshot implements witness.Witness.
func (w *Witness) Snapshot(c syscall.RawConn) (witness.Counters, error) {
	rec, err := w.Record(c)
	if err != nil {
		return witness.Counters{}, err
	}
	var (
		info *unix.TCPInfo
		ierr error
	)
	if err := c.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return witness.Counters{}, err
	}
	complete := rec.Flags&bpf.WitnessComplete != 0
	ctr := witness.Counters{
		BytesSent:      rec.TxBytes,
		HasBytesSent:   complete,
		DataSegsOut:    max(rec.TxDataSkbs, uint64(rec.K_dataSegsOut)),
		HasDataSegsOut: complete,
		BytesAcked:     rec.K_bytesAcked,
		Retransmits:    max(rec.RetransSegs, rec.K_totalRetrans),
		RTOs:           rec.Rtos,
		ResetReceived:  rec.Resets > 0,
		State:          rec.State,
		Source:         Source,
	}
	if rec.ResetNs != 0 {
		ctr.ResetAt = bootToWall(rec.ResetNs)
	}
	if ierr == nil && info != nil {
		ctr.BytesSent = max(ctr.BytesSent, info.Bytes_sent)
		ctr.DataSegsOut = max(ctr.DataSegsOut, uint64(info.Data_segs_out))
		ctr.BytesAcked = max(ctr.BytesAcked, info.Bytes_acked)
		ctr.Retransmits = max(ctr.Retransmits, info.Total_retrans)
		ctr.State = info.State
		// Bytes the socket holds but has not sent yet: they may still
		// leave after this snapshot (witness.NoByteLeft refuses a proof).
		ctr.NotSentBytes, ctr.HasNotSentBytes = uint64(info.Notsent_bytes), true
	}
	return ctr, nil
}

// bootToWall converts a CLOCK_BOOTTIME reading in ns to wall-clock time.
func bootToWall(ns uint64) time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}
	}
	now := time.Now()
	return now.Add(-time.Duration(uint64(ts.Nano()) - ns))
}

// SocketCookie returns the kernel's cookie of the socket behind c (the key
// of ring buffer events).
func SocketCookie(c syscall.RawConn) (uint64, error) {
	var (
		v    uint64
		serr error
	)
	err := c.Control(func(fd uintptr) {
		v, serr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE)
	})
	if err != nil {
		return 0, err
	}
	return v, serr
}
