package bpfload

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"unsafe"

	"github.com/cilium/ebpf"
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

// OriginalDstOf finds an accepted connection's original destination in
// egret's tuple map from user space: by the connection's network
// namespace cookie (SO_NETNS_COOKIE, Linux 5.14) and its two addresses, the
// key the sockops program wrote when the client connected. It is for
// connections that OriginalDst cannot answer: those accepted on a listener
// an earlier agent opened (adopted from `egret keeper`), which belongs to
// the earlier agent's cgroup — gone with its container — so egret's
// getsockopt program, attached to this agent's cgroup, does not run for
// them. ErrNoOriginalDst if the map has no such connection.
func (l *Loader) OriginalDstOf(c syscall.RawConn) (netip.AddrPort, error) {
	var (
		k    bpf.EgretTupleKey
		serr error
	)
	err := c.Control(func(fd uintptr) { k, serr = tupleKeyOf(int(fd)) })
	if err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, serr
	}
	var v bpf.EgretOrigDst
	if err := l.objs.EgretTuples.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return netip.AddrPort{}, ErrNoOriginalDst
		}
		return netip.AddrPort{}, fmt.Errorf("bpfload: egret_tuples: %w", err)
	}
	var a [16]byte
	for i, w := range v.Addr {
		binary.NativeEndian.PutUint32(a[4*i:], w)
	}
	return netip.AddrPortFrom(netip.AddrFrom16(a).Unmap(), v.Port), nil
}

// tupleKeyOf is the egret_tuples key of the accepted socket fd: the
// server is its local end, the client its peer, IPv4 addresses mapped.
func tupleKeyOf(fd int) (bpf.EgretTupleKey, error) {
	var k bpf.EgretTupleKey
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return k, fmt.Errorf("bpfload: SO_NETNS_COOKIE: %w", err)
	}
	local, err := unix.Getsockname(fd)
	if err != nil {
		return k, fmt.Errorf("bpfload: getsockname: %w", err)
	}
	peer, err := unix.Getpeername(fd)
	if err != nil {
		return k, fmt.Errorf("bpfload: getpeername: %w", err)
	}
	k.Netns = cookie
	var sp, cp uint16
	if k.Server, sp, err = keyAddr(local); err != nil {
		return k, err
	}
	if k.Client, cp, err = keyAddr(peer); err != nil {
		return k, err
	}
	k.ServerPort, k.ClientPort = sp, cp
	return k, nil
}

// keyAddr is a socket address as the BPF programs key it: the 16 bytes of
// the IPv6 (or IPv4-mapped) address as four words in memory order, and
// the port.
func keyAddr(sa unix.Sockaddr) ([4]uint32, uint16, error) {
	var a [16]byte
	var port int
	switch s := sa.(type) {
	case *unix.SockaddrInet4:
		a = netip.AddrFrom4(s.Addr).As16()
		port = s.Port
	case *unix.SockaddrInet6:
		a = s.Addr
		port = s.Port
	default:
		return [4]uint32{}, 0, fmt.Errorf("bpfload: not an IP socket: %T", sa)
	}
	var w [4]uint32
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(a[4*i:])
	}
	return w, uint16(port), nil
}
