package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// ErrRemoteListen: an address other than loopback was asked for without
// allowing remote clients (egret is not an open proxy by default).
var ErrRemoteListen = errors.New("listen address is not loopback")

// CheckListen accepts addr (host:port) when its host is a loopback address
// or "localhost", or when allowRemote is true. An empty host means every
// interface and is refused like any other non-loopback address.
func CheckListen(addr string, allowRemote bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if allowRemote || host == "localhost" {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err == nil && ip.Unmap().IsLoopback() {
		return nil
	}
	return fmt.Errorf("%w: %q (use a 127.0.0.1 or [::1] address, or allow remote clients explicitly)", ErrRemoteListen, addr)
}
