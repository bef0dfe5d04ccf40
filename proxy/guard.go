package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/egret-proxy/egret/retry"
)

// ErrDestinationDenied: in explicit mode egret will not connect to the
// address: it is in the policy's deny_destinations (cloud metadata
// endpoints by default) or it is one of egret's own listeners or protected
// addresses. A request refused so is not retried (profile_rejected).
var ErrDestinationDenied = fmt.Errorf("%w: destination denied", retry.ErrProfileRejected)

// guardDial returns the dial every upstream attempt, passthrough and
// CONNECT uses. In transparent mode it is d (the pod reaches through egret
// only what it could reach directly: its own network namespace and
// policy; a destination that is egret's own listener is refused when the
// connection is accepted, see loops). In explicit mode egret dials from its own network, so each
// address is checked (checkDest) before the connection is made: a name is
// checked as resolved, at connect(2), so that a name pointing at a denied
// address is caught too. A DialFunc given in the Config is checked before
// (an IP literal) and after (the address it connected to) it dials.
func (s *Server) guardDial(d DialFunc) DialFunc {
	if s.cfg.Mode != Explicit {
		if d == nil {
			nd := &net.Dialer{Timeout: s.cfg.DialTimeout}
			d = nd.DialContext
		}
		return d
	}
	if d == nil {
		// Names' resolver is egret's own: the name is resolved there and
		// each address it gives is checked as it is dialled.
		nd := &net.Dialer{Timeout: s.cfg.DialTimeout, Resolver: s.cfg.Names.Resolver,
			ControlContext: func(_ context.Context, _, address string, _ syscall.RawConn) error {
				ap, err := netip.ParseAddrPort(address)
				if err != nil {
					return err
				}
				return s.checkDest(ap)
			}}
		return nd.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if ap, err := netip.ParseAddrPort(addr); err == nil {
			if err := s.checkDest(ap); err != nil {
				return nil, &net.OpError{Op: "dial", Net: network, Err: err}
			}
		}
		c, err := d(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			if err := s.checkDest(ta.AddrPort()); err != nil {
				c.Close()
				return nil, &net.OpError{Op: "dial", Net: network, Err: err}
			}
		}
		return c, nil
	}
}

// loops reports whether a transparent connection's original destination
// dst is one of the Server's own listeners (also as 0.0.0.0, [::] or an
// IPv4-mapped form of its address): served, egret would dial itself for
// the connection, and again for that one.
func (s *Server) loops(dst netip.AddrPort) bool {
	return s.isSelf(netip.AddrPortFrom(reached(dst.Addr()), dst.Port()))
}

// checkTarget refuses, before any dial, an explicit-mode target given as
// an address egret must not connect to. A name is checked when dialled.
func (s *Server) checkTarget(host string, port int) error {
	a, err := netip.ParseAddr(host)
	if err != nil || port <= 0 || port > 65535 {
		return nil
	}
	return s.checkDest(netip.AddrPortFrom(a, uint16(port)))
}

// checkDest says why egret must not connect to ap for a client, or nil.
// It judges the address a connect(2) to ap reaches (reached): 0.0.0.0
// and [::] are this host's loopback, so a deny of 127.0.0.0/8 (or ::1)
// refuses them too, and so do the self checks.
func (s *Server) checkDest(ap netip.AddrPort) error {
	a := reached(ap.Addr())
	pol := s.cfg.Policy.Current()
	if pol.Denied(a) || pol.Denied(ap.Addr().WithZone("")) {
		return fmt.Errorf("%w: %s is in the policy's deny_destinations", ErrDestinationDenied, ap.Addr())
	}
	if s.isSelf(netip.AddrPortFrom(a, ap.Port())) {
		return fmt.Errorf("%w: %s is egret's own address (a loop, or its metrics)", ErrDestinationDenied, ap)
	}
	return nil
}

// reached is the address that a TCP connect(2) to a reaches on Linux, in
// the form the guards compare: an IPv4-mapped address is its IPv4 one;
// the unspecified address is the loopback of its family (the kernel
// connects 0.0.0.0, also as ::ffff:0.0.0.0, to 127.0.0.1 and :: to ::1);
// a zone is dropped (it names the link, not the host: fe80::1%eth0 is
// fe80::1, in fe80::/10).
func reached(a netip.Addr) netip.Addr {
	a = a.Unmap().WithZone("")
	switch a {
	case netip.IPv4Unspecified():
		return netip.AddrFrom4([4]byte{127, 0, 0, 1})
	case netip.IPv6Unspecified():
		return netip.IPv6Loopback()
	}
	return a
}

// isSelf reports whether ap (an address as reached gives it) reaches one
// of the Server's listeners or protected addresses: the same port, and
// the same address or, for one listening on every address, any address
// of this host.
func (s *Server) isSelf(ap netip.AddrPort) bool {
	var own []netip.AddrPort
	s.mu.Lock()
	for l := range s.listeners {
		if ta, ok := l.Addr().(*net.TCPAddr); ok {
			own = append(own, ta.AddrPort())
		}
	}
	s.mu.Unlock()
	own = append(own, s.protect...)
	local := -1 // unknown yet
	for _, o := range own {
		if o.Port() != ap.Port() {
			continue
		}
		oa := o.Addr().Unmap().WithZone("")
		if oa == ap.Addr() {
			return true
		}
		if oa.IsUnspecified() {
			if local < 0 {
				local = 0
				if isLocalAddr(ap.Addr()) {
					local = 1
				}
			}
			if local == 1 {
				return true
			}
		}
	}
	return false
}

// isLocalAddr reports whether a is an address of this host (in egret's
// network namespace): unspecified, loopback or an interface's.
func isLocalAddr(a netip.Addr) bool {
	if a.IsUnspecified() || a.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // unknown: refuse rather than risk a loop
	}
	for _, x := range addrs {
		if n, ok := x.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
				return true
			}
		}
	}
	return false
}

// connectAllowed says why an explicit-mode CONNECT to port may not be
// tunnelled, or nil.
func (s *Server) connectAllowed(port string) error {
	n, err := strconv.Atoi(port)
	if err != nil || n <= 0 || n > 65535 {
		return fmt.Errorf("CONNECT needs host:port, got port %q", port)
	}
	if !slices.Contains(s.cfg.ConnectPorts, n) {
		return fmt.Errorf("CONNECT to port %d is not allowed (allowed: %v)", n, s.cfg.ConnectPorts)
	}
	return nil
}

// logURL is u as log lines and traces show it: without user information,
// and without the query string and fragment unless Config.LogQuery.
func (s *Server) logURL(u *url.URL) string { return logURL(u, s.cfg.LogQuery) }

func logURL(u *url.URL, logQuery bool) string {
	if u.User == nil && (logQuery || u.RawQuery == "" && !u.ForceQuery && u.Fragment == "") {
		return u.String()
	}
	v := *u
	v.User = nil
	if !logQuery {
		v.RawQuery, v.ForceQuery, v.Fragment, v.RawFragment = "", false, "", ""
	}
	return v.String()
}

// putTrace stores a finished request's trace, its URL shown as logURL
// shows it.
func (s *Server) putTrace(tr *retry.Trace) {
	if tr != nil && strings.ContainsAny(tr.URL, "?#@") {
		if u, err := url.Parse(tr.URL); err == nil {
			tr.URL = s.logURL(u)
		}
	}
	s.cfg.Traces.Put(tr)
}
