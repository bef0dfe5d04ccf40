package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/proxy"
)

// bpfResolver gives each accepted connection's original destination from
// egret's cgroup/getsockopt program (SO_ORIGINAL_DST), which looks the
// connection up by its tuple and network namespace cookie, so pods with
// identical addresses never see each other's destinations. A destination
// equal to the pod's own listener is refused: it would loop.
//
// A connection accepted on an adopted listener (made by an earlier agent,
// in its cgroup: egret's getsockopt program does not run for it) gets no
// SO_ORIGINAL_DST answer; lookup (Attacher.OriginalDstOf) finds it in the
// kernel's tuple map instead.
type bpfResolver struct {
	listeners []netip.AddrPort
	lookup    func(syscall.RawConn) (netip.AddrPort, error)
}

var _ proxy.Resolver = bpfResolver{}

func (r bpfResolver) OriginalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%w: %T has no socket", proxy.ErrNoOriginalDst, c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: %v", proxy.ErrNoOriginalDst, err)
	}
	dst, err := bpfload.OriginalDst(rc)
	if errors.Is(err, bpfload.ErrNoOriginalDst) && r.lookup != nil {
		dst, err = r.lookup(rc)
	}
	if err != nil {
		if errors.Is(err, bpfload.ErrNoOriginalDst) {
			return netip.AddrPort{}, fmt.Errorf("%w: connection was not redirected by egret", proxy.ErrNoOriginalDst)
		}
		return netip.AddrPort{}, fmt.Errorf("%w: %v", proxy.ErrNoOriginalDst, err)
	}
	for _, l := range r.listeners {
		if dst == l {
			return netip.AddrPort{}, fmt.Errorf("%w: original destination %s is egret's own listener", proxy.ErrNoOriginalDst, dst)
		}
	}
	return dst, nil
}
