package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
)

// ErrNoOriginalDst: the resolver does not know where a connection was going.
var ErrNoOriginalDst = errors.New("original destination unknown")

// Resolver tells, in transparent mode, where an accepted connection was
// going before it was redirected to the proxy.
type Resolver interface {
	OriginalDst(conn net.Conn) (netip.AddrPort, error)
}

// ResolverFunc adapts a function to Resolver.
type ResolverFunc func(conn net.Conn) (netip.AddrPort, error)

// OriginalDst calls f.
func (f ResolverFunc) OriginalDst(conn net.Conn) (netip.AddrPort, error) { return f(conn) }

// StaticResolver answers one destination for every connection, or, when
// ByClient has an entry for the connection's remote address, that entry.
// Tests and single-upstream setups use it. Safe for concurrent use.
type StaticResolver struct {
	Dst netip.AddrPort

	mu       sync.Mutex
	byClient map[netip.AddrPort]netip.AddrPort
}

// Set makes connections from client resolve to dst.
func (r *StaticResolver) Set(client, dst netip.AddrPort) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byClient == nil {
		r.byClient = make(map[netip.AddrPort]netip.AddrPort)
	}
	r.byClient[client] = dst
}

// OriginalDst implements Resolver.
func (r *StaticResolver) OriginalDst(conn net.Conn) (netip.AddrPort, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ra, ok := conn.RemoteAddr().(*net.TCPAddr); ok && r.byClient != nil {
		if d, ok := r.byClient[ra.AddrPort()]; ok {
			return d, nil
		}
	}
	if !r.Dst.IsValid() {
		return netip.AddrPort{}, fmt.Errorf("%w: no static destination", ErrNoOriginalDst)
	}
	return r.Dst, nil
}

var (
	_ Resolver = (*StaticResolver)(nil)
	_ Resolver = ResolverFunc(nil)
	_ Resolver = SockoptResolver{}
)
