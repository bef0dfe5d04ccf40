//go:build linux

package witness

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tcpInfoCall is one getsockopt(TCP_INFO), pooled with its method value so
// that a snapshot allocates nothing.
type tcpInfoCall struct {
	info   unix.TCPInfo
	optlen uint32
	errno  syscall.Errno
	fn     func(fd uintptr)
}

func (t *tcpInfoCall) call(fd uintptr) {
	_, _, t.errno = unix.RawSyscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&t.info)), uintptr(unsafe.Pointer(&t.optlen)), 0)
}

var tcpInfoCalls = sync.Pool{New: func() any {
	t := &tcpInfoCall{}
	t.fn = t.call
	return t
}}

// Snapshot reads TCP_INFO of the socket behind c.
func (TCPInfo) Snapshot(c syscall.RawConn) (Counters, error) {
	if c == nil {
		return Counters{}, ErrUnsupported
	}
	t := tcpInfoCalls.Get().(*tcpInfoCall)
	defer tcpInfoCalls.Put(t)
	t.info, t.errno = unix.TCPInfo{}, 0
	t.optlen = uint32(unsafe.Sizeof(t.info))
	if err := c.Control(t.fn); err != nil {
		return Counters{}, fmt.Errorf("witness: tcp_info: %w", err)
	}
	if serr := t.errno; serr != 0 {
		if serr == unix.ENOPROTOOPT || serr == unix.EOPNOTSUPP || serr == unix.ENOTSOCK {
			return Counters{}, fmt.Errorf("%w: %v", ErrUnsupported, serr)
		}
		return Counters{}, fmt.Errorf("witness: tcp_info: %w", serr)
	}
	info, optlen := &t.info, t.optlen
	has := func(off, size uintptr) bool { return uintptr(optlen) >= off+size }
	out := Counters{
		State:       info.State,
		Retransmits: info.Total_retrans,
		RTOs:        uint32(info.Backoff),
		Source:      sourceTCPInfo,
	}
	if has(unsafe.Offsetof(info.Bytes_acked), unsafe.Sizeof(info.Bytes_acked)) {
		out.BytesAcked, out.HasBytesAcked = info.Bytes_acked, true
	}
	if has(unsafe.Offsetof(info.Data_segs_out), unsafe.Sizeof(info.Data_segs_out)) {
		out.DataSegsOut, out.HasDataSegsOut = uint64(info.Data_segs_out), true
	}
	if has(unsafe.Offsetof(info.Notsent_bytes), unsafe.Sizeof(info.Notsent_bytes)) {
		out.NotSentBytes, out.HasNotSentBytes = uint64(info.Notsent_bytes), true
	}
	if has(unsafe.Offsetof(info.Bytes_received), unsafe.Sizeof(info.Bytes_received)) {
		out.BytesReceived, out.HasBytesReceived = info.Bytes_received, true
	}
	if has(unsafe.Offsetof(info.Bytes_sent), unsafe.Sizeof(info.Bytes_sent)) {
		out.BytesSent, out.HasBytesSent = info.Bytes_sent, true
	}
	return out, nil
}
