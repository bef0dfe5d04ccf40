// Package socklb is a test-only stand-in for a CNI's socket load balancer
// (Cilium's socket LB): a cgroup/connect4 program (socklb.c) that rewrites
// connects to one Service address to its backend, meant to be attached at
// an ancestor cgroup of egret's pods, and that records every destination it
// saw per cgroup. agent/bpfload's tests use it to show the order of
// multi-attached cgroup programs. The bpf2go output is committed, as
// egret's own (bpf/).
package socklb

import (
	"encoding/binary"
	"net/netip"
)

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-16 -strip llvm-strip-16 -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu" -type lb_config -type seen_key Socklb socklb.c

// Load loads the program and its maps, set to send connects to service
// (an IPv4 address and port) to backend instead.
func Load(service, backend netip.AddrPort) (*SocklbObjects, error) {
	var objs SocklbObjects
	if err := LoadSocklbObjects(&objs, nil); err != nil {
		return nil, err
	}
	cfg := SocklbLbConfig{
		ServiceIp: ip4(service.Addr()), ServicePort: port16(service.Port()),
		BackendIp: ip4(backend.Addr()), BackendPort: port16(backend.Port()),
	}
	if err := objs.SocklbConfig.Put(uint32(0), cfg); err != nil {
		objs.Close()
		return nil, err
	}
	return &objs, nil
}

// Saw is what the program saw: connects by the connecting socket's
// cgroup id and the destination as the program found it.
func Saw(objs *SocklbObjects) (map[uint64]map[netip.AddrPort]uint64, error) {
	out := map[uint64]map[netip.AddrPort]uint64{}
	var k SocklbSeenKey
	var n uint64
	it := objs.SocklbSeen.Iterate()
	for it.Next(&k, &n) {
		var ip [4]byte
		binary.NativeEndian.PutUint32(ip[:], k.Ip)
		var p [2]byte
		binary.NativeEndian.PutUint16(p[:], k.Port)
		if out[k.CgroupId] == nil {
			out[k.CgroupId] = map[netip.AddrPort]uint64{}
		}
		out[k.CgroupId][netip.AddrPortFrom(netip.AddrFrom4(ip), binary.BigEndian.Uint16(p[:]))] = n
	}
	return out, it.Err()
}

// ClearSaw forgets what the program saw.
func ClearSaw(objs *SocklbObjects) error {
	var k SocklbSeenKey
	var keys []SocklbSeenKey
	var n uint64
	it := objs.SocklbSeen.Iterate()
	for it.Next(&k, &n) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range keys {
		if err := objs.SocklbSeen.Delete(&k); err != nil {
			return err
		}
	}
	return nil
}

// ip4 and port16 are an address and a port in network byte order, as the
// program reads them from its native-endian map.
func ip4(a netip.Addr) uint32 { b := a.As4(); return binary.NativeEndian.Uint32(b[:]) }

func port16(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}
