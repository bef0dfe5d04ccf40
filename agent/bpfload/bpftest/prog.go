package bpftest

import (
	"errors"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// ProgExists reports whether a program with this id is still loaded.
func ProgExists(id uint32) bool {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	p.Close()
	return true
}

// cgroupAttachTypes are the attach points egret uses on a cgroup.
var cgroupAttachTypes = []ebpf.AttachType{
	ebpf.AttachCGroupInet4Connect,
	ebpf.AttachCGroupInet6Connect,
	ebpf.AttachCGroupSockOps,
	ebpf.AttachCGroupGetsockopt,
}

// AttachedPrograms lists the program ids attached directly to a cgroup at
// the attach points egret uses.
func AttachedPrograms(cgroup string) ([]uint32, error) {
	f, err := os.Open(cgroup)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ids []uint32
	for _, at := range cgroupAttachTypes {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
		if err != nil {
			return nil, err
		}
		for _, p := range res.Programs {
			ids = append(ids, uint32(p.ID))
		}
	}
	return ids, nil
}
