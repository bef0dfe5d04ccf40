//go:build !linux

package proxy

import (
	"fmt"
	"net"
	"net/netip"
)

// SockoptResolver reads SO_ORIGINAL_DST, which only Linux has; elsewhere
// it knows no destination.
type SockoptResolver struct{}

// OriginalDst implements Resolver.
func (SockoptResolver) OriginalDst(net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, fmt.Errorf("%w: SO_ORIGINAL_DST needs Linux", ErrNoOriginalDst)
}
