//go:build linux

package witness

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Snapshot reads TCP_INFO of the socket behind c.
func (TCPInfo) Snapshot(c syscall.RawConn) (Counters, error) {
	if c == nil {
		return Counters{}, ErrUnsupported
	}
	var (
		info   unix.TCPInfo
		optlen = uint32(unsafe.Sizeof(info))
		serr   error
	)
	err := c.Control(func(fd uintptr) {
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO,
			uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&optlen)), 0)
		if errno != 0 {
			serr = errno
		}
	})
	if err != nil {
		return Counters{}, fmt.Errorf("witness: tcp_info: %w", err)
	}
	if serr != nil {
		if serr == unix.ENOPROTOOPT || serr == unix.EOPNOTSUPP || serr == unix.ENOTSOCK {
			return Counters{}, fmt.Errorf("%w: %v", ErrUnsupported, serr)
		}
		return Counters{}, fmt.Errorf("witness: tcp_info: %w", serr)
	}
	has := func(off, size uintptr) bool { return uintptr(optlen) >= off+size }
	out := Counters{
		State:       info.State,
		Retransmits: info.Total_retrans,
		RTOs:        uint32(info.Backoff),
		Source:      sourceTCPInfo,
	}
	if has(unsafe.Offsetof(info.Bytes_acked), unsafe.Sizeof(info.Bytes_acked)) {
		out.BytesAcked = info.Bytes_acked
	}
	if has(unsafe.Offsetof(info.Data_segs_out), unsafe.Sizeof(info.Data_segs_out)) {
		out.DataSegsOut, out.HasDataSegsOut = uint64(info.Data_segs_out), true
	}
	if has(unsafe.Offsetof(info.Notsent_bytes), unsafe.Sizeof(info.Notsent_bytes)) {
		out.NotSentBytes, out.HasNotSentBytes = uint64(info.Notsent_bytes), true
	}
	if has(unsafe.Offsetof(info.Bytes_sent), unsafe.Sizeof(info.Bytes_sent)) {
		out.BytesSent, out.HasBytesSent = info.Bytes_sent, true
	}
	return out, nil
}
