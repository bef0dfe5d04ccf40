package bpftest

import (
	"errors"
	"os"

	"github.com/cilium/ebpf"
)

func progExists(id uint32) bool {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	p.Close()
	return true
}
