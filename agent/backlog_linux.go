//go:build linux

package agent

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// acceptQueue returns how many connections wait in l's accept queue (the
// kernel reports it as tcpi_unacked of a listening socket), or false when
// it cannot tell.
func acceptQueue(l net.Listener) (int, bool) {
	sc, ok := l.(syscall.Conn)
	if !ok {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || gerr != nil || info.State != unix.BPF_TCP_LISTEN {
		return 0, false
	}
	return int(info.Unacked), true
}

// waitAccepted waits, up to max, until nothing waits in the accept queues of
// lns: closing a listener resets the connections still queued on it, and a
// stopping pod's last redirected connections must reach its proxy instead.
// It reports whether the queues emptied.
func waitAccepted(lns []net.Listener, max time.Duration) bool {
	deadline := time.Now().Add(max)
	for {
		pending := false
		for _, l := range lns {
			if n, ok := acceptQueue(l); ok && n > 0 {
				pending = true
			}
		}
		if !pending {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}
