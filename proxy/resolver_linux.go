package proxy

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SockoptResolver reads a connection's original destination with
// getsockopt(SO_ORIGINAL_DST) (IP6T_SO_ORIGINAL_DST for IPv6). The node
// agent's cgroup/getsockopt eBPF program answers it for redirected
// connections; iptables REDIRECT answers it too.
type SockoptResolver struct{}

// OriginalDst implements Resolver.
func (SockoptResolver) OriginalDst(conn net.Conn) (netip.AddrPort, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%w: %T has no socket", ErrNoOriginalDst, conn)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: %v", ErrNoOriginalDst, err)
	}
	v6 := false
	if la, ok := conn.LocalAddr().(*net.TCPAddr); ok {
		v6 = la.IP.To4() == nil
	}
	var dst netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) { dst, serr = originalDst(int(fd), v6) })
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: %v", ErrNoOriginalDst, err)
	}
	return dst, nil
}

// originalDst asks the kernel for the socket's original destination. The
// answer is a sockaddr_in (or sockaddr_in6); the getsockopt helpers of x/sys
// that read a struct of the same size carry it.
func originalDst(fd int, v6 bool) (netip.AddrPort, error) {
	if v6 {
		// sockaddr_in6 is 28 bytes; IPv6MTUInfo (32) holds it.
		mi, err := unix.GetsockoptIPv6MTUInfo(fd, unix.SOL_IPV6, ip6tSoOriginalDst)
		if err != nil {
			return netip.AddrPort{}, err
		}
		raw := (*[unsafe.Sizeof(*mi)]byte)(unsafe.Pointer(mi))
		port := binary.BigEndian.Uint16(raw[2:4])
		addr := netip.AddrFrom16([16]byte(raw[8:24]))
		return netip.AddrPortFrom(addr.Unmap(), port), nil
	}
	// sockaddr_in is 16 bytes; IPv6Mreq (16) holds it.
	mr, err := unix.GetsockoptIPv6Mreq(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST)
	if err != nil {
		return netip.AddrPort{}, err
	}
	raw := mr.Multiaddr
	port := binary.BigEndian.Uint16(raw[2:4])
	addr := netip.AddrFrom4([4]byte(raw[4:8]))
	return netip.AddrPortFrom(addr, port), nil
}

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h),
// the same number as SO_ORIGINAL_DST at level SOL_IPV6.
const ip6tSoOriginalDst = 80
