package bpfload

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/bpf"
)

// ErrNoOriginalDst means the connection was not redirected by egret (nor
// by a netfilter REDIRECT rule): getsockopt SO_ORIGINAL_DST had no answer.
var ErrNoOriginalDst = errors.New("bpfload: no original destination for this connection")

// OriginalDst returns where the client behind an accepted connection meant
// to connect, by asking getsockopt SO_ORIGINAL_DST (SOL_IP for IPv4
// sockets, SOL_IPV6 for IPv6 ones) — answered by egret's cgroup/getsockopt
// program, or by netfilter for iptables REDIRECT. IPv4 originals seen on
// a dual-stack IPv6 socket come back unmapped.
func OriginalDst(c syscall.RawConn) (netip.AddrPort, error) {
	var (
		ap   netip.AddrPort
		serr error
	)
	err := c.Control(func(fd uintptr) {
		ap, serr = originalDstFD(int(fd))
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	return ap, serr
}

func originalDstFD(fd int) (netip.AddrPort, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bpfload: getsockname: %w", err)
	}
	var buf [28]byte
	level := unix.SOL_IP
	size := uint32(16)
	if _, ok := sa.(*unix.SockaddrInet6); ok {
		level, size = unix.SOL_IPV6, 28
	}
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), bpf.SOOriginalDst,
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
	if errno != 0 {
		if errno == unix.ENOPROTOOPT || errno == unix.ENOENT {
			return netip.AddrPort{}, ErrNoOriginalDst
		}
		return netip.AddrPort{}, fmt.Errorf("bpfload: getsockopt SO_ORIGINAL_DST: %w", errno)
	}
	family := binary.NativeEndian.Uint16(buf[0:])
	port := binary.BigEndian.Uint16(buf[2:])
	switch {
	case family == unix.AF_INET && size >= 8:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[4:8])), port), nil
	case family == unix.AF_INET6 && size >= 24:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(buf[8:24])).Unmap(), port), nil
	}
	return netip.AddrPort{}, fmt.Errorf("bpfload: SO_ORIGINAL_DST: unexpected family %d length %d", family, size)
}
