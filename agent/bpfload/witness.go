package bpfload

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/bpf"
	"github.com/egret-proxy/egret/witness"
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
//
// Snapshot's system calls (the map lookup, TCP_INFO) are raw ones: a call
// through the scheduler's system-call state wakes Go's monitor thread after
// every idle moment, which then polls every 20 µs (see internal/rawsock),
// and Snapshot runs once per proxied request.
type Witness struct {
	m *ebpf.Map
	// raw: the record is read with a raw BPF_MAP_LOOKUP_ELEM (the map's
	// value is a Record byte for byte); else through cilium/ebpf.
	raw bool
}

var _ witness.Witness = (*Witness)(nil)

// Witness returns the eBPF witness backed by this loader's maps.
func (l *Loader) Witness() *Witness {
	m := l.objs.EgretWitness
	return &Witness{m: m, raw: m.KeySize() == 4 && m.ValueSize() == uint32(unsafe.Sizeof(Record{}))}
}

// Record is the raw per-socket record plus the socket's cookie.
type Record = bpf.EgretWitnessRec

// mapElemAttr is union bpf_attr as the BPF_MAP_*_ELEM commands read it.
type mapElemAttr struct {
	mapFD uint32
	_     uint32
	key   uint64 // a pointer
	value uint64 // a pointer
	flags uint64
}

// lookupCall is one BPF_MAP_LOOKUP_ELEM of the witness map by a socket's
// fd, pooled with its method value so that a lookup allocates nothing.
type lookupCall struct {
	attr  mapElemAttr // its map_fd set by lookup, the rest by call
	key   int32
	rec   Record
	errno syscall.Errno
	fn    func(fd uintptr)
}

func (l *lookupCall) call(fd uintptr) {
	l.key = int32(fd)
	l.attr.key, l.attr.value = uint64(uintptr(unsafe.Pointer(&l.key))), uint64(uintptr(unsafe.Pointer(&l.rec)))
	_, _, l.errno = unix.RawSyscall(unix.SYS_BPF, unix.BPF_MAP_LOOKUP_ELEM, uintptr(unsafe.Pointer(&l.attr)), unsafe.Sizeof(l.attr))
}

var lookupCalls = sync.Pool{New: func() any {
	l := &lookupCall{}
	l.fn = l.call
	return l
}}

// lookup reads the record of the socket behind c: err when c cannot be
// used (closed), lerr when the map has no record or the lookup failed.
func (w *Witness) lookup(c syscall.RawConn) (Record, error, error) {
	if !w.raw {
		return w.lookupLibrary(c)
	}
	l := lookupCalls.Get().(*lookupCall)
	defer lookupCalls.Put(l)
	l.rec, l.errno, l.attr = Record{}, 0, mapElemAttr{mapFD: uint32(w.m.FD())}
	if err := c.Control(l.fn); err != nil {
		return Record{}, nil, err
	}
	switch l.errno {
	case 0:
		return l.rec, nil, nil
	case unix.ENOENT:
		return Record{}, ebpf.ErrKeyNotExist, nil
	}
	return Record{}, fmt.Errorf("lookup: %w", l.errno), nil
}

// lookupLibrary is lookup through cilium/ebpf's Map.Lookup (its own
// function: the closure's captures would make lookup allocate).
func (w *Witness) lookupLibrary(c syscall.RawConn) (rec Record, lerr, err error) {
	err = c.Control(func(fd uintptr) { lerr = w.m.Lookup(uint32(fd), &rec) })
	return rec, lerr, err
}

// Record returns the raw kernel record of the socket behind c.
func (w *Witness) Record(c syscall.RawConn) (Record, error) {
	rec, lerr, err := w.lookup(c)
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
	// TCP_INFO, read live (witness.TCPInfo's call is a raw one too). Its
	// failure leaves the record's counts, unless c itself cannot be used.
	info, ierr := witness.TCPInfo{}.Snapshot(c)
	if errors.Is(ierr, net.ErrClosed) {
		return witness.Counters{}, ierr
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
	if ierr == nil {
		ctr.BytesSent = max(ctr.BytesSent, info.BytesSent)
		ctr.DataSegsOut = max(ctr.DataSegsOut, info.DataSegsOut)
		ctr.BytesAcked = max(ctr.BytesAcked, info.BytesAcked)
		ctr.HasBytesAcked = info.HasBytesAcked
		ctr.Retransmits = max(ctr.Retransmits, info.Retransmits)
		ctr.State = info.State
		ctr.BytesReceived, ctr.HasBytesReceived = info.BytesReceived, info.HasBytesReceived
		// Bytes the socket holds but has not sent yet: they may still
		// leave after this snapshot (witness.NoByteLeft refuses a proof).
		ctr.NotSentBytes, ctr.HasNotSentBytes = info.NotSentBytes, info.HasNotSentBytes
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
