package bpfload

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// SetAlive puts a socket of the Loader's own into egret_alive: a TCP
// listener on 127.0.0.1 (backlog 1, never accepted from) that nothing else
// holds: it is close-on-exec and never passed on. The connect programs
// redirect only while egret_alive holds a socket, and the kernel removes a
// socket from a sockmap when it closes, so the entry goes with the Loader
// (Close) or with its process, however that ends (a SIGKILL too): then the
// pods' new connects go direct even while their listeners live on in
// `egret keeper`. Call it once the agent serves its pods (their listeners
// open or adopted): connects before go direct rather than wait in a
// listener's queue. Another Loader's SetAlive on the same pin directory
// replaces the entry with its own socket. Calling it again is a no-op.
func (l *Loader) SetAlive() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("bpfload: SetAlive on a closed Loader")
	}
	if l.aliveFD >= 0 {
		return nil
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bpfload: liveness socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("bpfload: liveness socket: bind: %w", err)
	}
	if err := unix.Listen(fd, 1); err != nil {
		unix.Close(fd)
		return fmt.Errorf("bpfload: liveness socket: listen: %w", err)
	}
	if err := l.objs.EgretAlive.Update(uint32(0), uint64(fd), ebpf.UpdateAny); err != nil {
		unix.Close(fd)
		return fmt.Errorf("bpfload: liveness socket into egret_alive: %w", err)
	}
	l.aliveFD = fd
	return nil
}

// Alive says whether egret_alive holds a socket: whether pods' connects
// are redirected now (some agent's Loader is open on this pin directory).
func (l *Loader) Alive() (bool, error) {
	var cookie uint64
	err := l.objs.EgretAlive.Lookup(uint32(0), &cookie)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return false, nil
	}
	return false, fmt.Errorf("bpfload: egret_alive: %w", err)
}
