package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

type sockRep struct {
	fd  int
	err error
}

// prefetch is how many sockets of each family the namespace's socket
// thread keeps made in advance.
const prefetch = 4

// startWorker starts the namespace's socket thread: a goroutine locked to
// an OS thread that enters the namespace once and is never unlocked, so
// the thread is retired when the goroutine ends (at Close). It keeps a few
// sockets of each family made in advance, so a dial takes one without
// waiting for the thread to be scheduled.
func (n *NS) startWorker() {
	n.ready4 = make(chan sockRep, prefetch)
	n.ready6 = make(chan sockRep, prefetch)
	n.quit = make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with us
		if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
			started <- fmt.Errorf("%w %s: %v", ErrNetns, n.path, err)
			return
		}
		started <- nil
		make1 := func(family int) sockRep {
			fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
			if err != nil {
				return sockRep{fd: -1, err: os.NewSyscallError("socket", err)}
			}
			return sockRep{fd: fd}
		}
		next4, next6 := make1(unix.AF_INET), make1(unix.AF_INET6)
		for {
			select {
			case <-n.quit:
				for _, r := range []sockRep{next4, next6} {
					if r.err == nil {
						unix.Close(r.fd)
					}
				}
				for _, ch := range []chan sockRep{n.ready4, n.ready6} {
					for {
						select {
						case r := <-ch:
							if r.err == nil {
								unix.Close(r.fd)
							}
							continue
						default:
						}
						break
					}
				}
				return
			case n.ready4 <- next4:
				next4 = make1(unix.AF_INET)
			case n.ready6 <- next6:
				next6 = make1(unix.AF_INET6)
			}
		}
	}()
	n.wErr = <-started
}

// socket returns a non-blocking TCP socket of family made inside the
// namespace.
func (n *NS) socket(family int) (int, error) {
	n.once.Do(n.startWorker)
	if n.wErr != nil {
		return -1, n.wErr
	}
	ch := n.ready4
	if family == unix.AF_INET6 {
		ch = n.ready6
	}
	select {
	case r := <-ch:
		return r.fd, r.err
	case <-n.quit:
		return -1, fmt.Errorf("%w %s: closed", ErrNetns, n.path)
	}
}

// dialInside connects a socket made in the namespace to address (an IP
// and port) with the Go runtime's poller, honouring ctx and d.Timeout.
func (d *Dialer) dialInside(ctx context.Context, network, address string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil, err
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	raddr := net.TCPAddrFromAddrPort(ap)
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: network, Addr: raddr, Err: err}
	}
	family := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	if ap.Addr().Is4() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	if (network == "tcp4" && family != unix.AF_INET) || (network == "tcp6" && family != unix.AF_INET6) {
		return nil, opErr(fmt.Errorf("address %s does not match network %s", address, network))
	}
	fd, err := d.NS.socket(family)
	if err != nil {
		return nil, opErr(err)
	}
	if d.Mark != 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(d.Mark)); err != nil {
			unix.Close(fd)
			return nil, opErr(os.NewSyscallError("setsockopt", err))
		}
	}
	cerr := unix.Connect(fd, sa)
	if cerr != nil && !errors.Is(cerr, unix.EINPROGRESS) {
		unix.Close(fd)
		return nil, opErr(os.NewSyscallError("connect", cerr))
	}
	// Hand the socket to the runtime as a net.Conn now (FileConn dups it,
	// makes the copy non-blocking and registers it with the poller; the
	// original is blocking meanwhile so that os.NewFile does not register
	// it too), then wait on the Conn for the connect to finish.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, opErr(os.NewSyscallError("fcntl", err))
	}
	f := os.NewFile(uintptr(fd), "tcp")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, opErr(err)
	}
	if cerr == nil {
		return c, nil
	}
	deadline, _ := ctx.Deadline()
	if d.Timeout > 0 {
		if t := time.Now().Add(d.Timeout); deadline.IsZero() || t.Before(deadline) {
			deadline = t
		}
	}
	if !deadline.IsZero() {
		c.SetWriteDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { c.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		c.Close()
		return nil, opErr(err)
	}
	// Write resets the poller's readiness before calling f, so f looks at
	// the socket itself each time: done, failed, or not yet (then Write
	// waits for the socket to become writable).
	var soErr error
	werr := rc.Write(func(fd uintptr) bool {
		v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		switch {
		case err != nil:
			soErr = os.NewSyscallError("getsockopt", err)
		case v != 0:
			soErr = os.NewSyscallError("connect", syscall.Errno(v))
		default:
			if _, err := unix.Getpeername(int(fd)); err != nil {
				return false // not connected yet
			}
		}
		return true
	})
	switch {
	case ctx.Err() != nil:
		werr = ctx.Err()
	case werr == nil:
		werr = soErr
	}
	if werr != nil {
		c.Close()
		return nil, opErr(werr)
	}
	c.SetWriteDeadline(time.Time{})
	return c, nil
}
