package netns

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Veth joins ns to the agent's namespace with a veth pair: hostIf (in the
// agent's namespace) gets host, the peer (renamed eth0 in ns) gets peer,
// and ns gets a default route through host's address. Both prefixes must
// be of one family and subnet. DeleteLink(hostIf) removes the pair.
func Veth(ns *NS, hostIf string, host, peer netip.Prefix) error {
	tmp := hostIf + "p"
	la := netlink.NewLinkAttrs()
	la.Name = hostIf
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: tmp}); err != nil {
		return fmt.Errorf("%w: veth %s: %v", ErrNetns, hostIf, err)
	}
	fail := func(err error) error {
		_ = DeleteLink(hostIf)
		return fmt.Errorf("%w: veth %s: %v", ErrNetns, hostIf, err)
	}
	hl, err := netlink.LinkByName(hostIf)
	if err != nil {
		return fail(err)
	}
	pl, err := netlink.LinkByName(tmp)
	if err != nil {
		return fail(err)
	}
	if err := netlink.LinkSetNsFd(pl, int(ns.f.Fd())); err != nil {
		return fail(err)
	}
	if err := netlink.AddrAdd(hl, nlAddr(host)); err != nil {
		return fail(err)
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		return fail(err)
	}
	err = ns.Do(func() error {
		l, err := netlink.LinkByName(tmp)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetName(l, "eth0"); err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, nlAddr(peer)); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: host.Addr().AsSlice()})
	})
	if err != nil {
		return fail(err)
	}
	return nil
}

func nlAddr(p netip.Prefix) *netlink.Addr {
	return &netlink.Addr{
		IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())},
		Flags: unix.IFA_F_NODAD,
	}
}

// DeleteLink removes the interface called name in the agent's namespace
// (for a veth, both ends); a missing one is not an error.
func DeleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if _, ok := err.(netlink.LinkNotFoundError); ok {
			return nil
		}
		return fmt.Errorf("%w: %s: %v", ErrNetns, name, err)
	}
	return netlink.LinkDel(l)
}
