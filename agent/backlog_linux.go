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

// acceptListener is a listener that tells of each Accept: an accept is the
// only thing that shrinks its accept queue (a queued connection the client
// resets stays queued until accepted), so waitAccepted waits on it rather
// than looking at the queue again and again.
type acceptListener struct {
	net.Listener
	// accepted holds a token after each Accept that returned (one is
	// enough: the waiter looks at the queue again).
	accepted chan struct{}
}

func newAcceptListener(l net.Listener) *acceptListener {
	return &acceptListener{Listener: l, accepted: make(chan struct{}, 1)}
}

// Accept accepts as the listener does and then tells waitAccepted.
func (l *acceptListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	select {
	case l.accepted <- struct{}{}:
	default:
	}
	return c, err
}

// waitAccepted waits, up to max, until nothing waits in the accept queues of
// lns: closing a listener resets the connections still queued on it, and a
// stopping pod's last redirected connections must reach its proxy instead.
// It looks at a queue (TCP_INFO) when it starts and after each accept on
// that listener, never on a clock. It reports whether the queues emptied.
func waitAccepted(lns []*acceptListener, max time.Duration) bool {
	t := time.NewTimer(max)
	defer t.Stop()
	for {
		var pending *acceptListener
		for _, l := range lns {
			if n, ok := acceptQueue(l.Listener); ok && n > 0 {
				pending = l
				break
			}
		}
		if pending == nil {
			return true
		}
		select {
		case <-pending.accepted:
		case <-t.C:
			return false
		}
	}
}
