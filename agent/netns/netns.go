// Package netns makes sockets inside other network namespaces.
//
// A socket belongs to the network namespace of the thread that created it,
// for its whole life, whichever thread uses it later. So the agent creates
// a pod's listener and its upstream sockets on a locked OS thread that has
// entered the pod's namespace (setns), puts the thread back, and then uses
// the sockets from any goroutine. A thread whose namespace cannot be put
// back is never unlocked, so the Go runtime retires it instead of reusing
// it elsewhere.
package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNetns: a namespace path that cannot be opened or entered.
var ErrNetns = errors.New("netns: cannot enter network namespace")

// NS is a network namespace, held open by a file descriptor so that it
// stays usable while the NS is open even if its bind mount goes.
type NS struct {
	path string
	f    *os.File // nil: the namespace the process started in

	// A thread that stays in the namespace and makes sockets on request
	// (started on first use): cheaper per upstream dial than entering the
	// namespace each time.
	once   sync.Once
	ready4 chan sockRep
	ready6 chan sockRep
	quit   chan struct{}
	wErr   error

	closeOnce sync.Once
}

// Host returns the namespace the calling process is in; Do runs its
// function directly.
func Host() *NS { return &NS{path: "host"} }

// Open opens the namespace at path (/proc/PID/ns/net, /run/netns/NAME).
// An empty path is Host().
func Open(path string) (*NS, error) {
	if path == "" {
		return Host(), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrNetns, path, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, fmt.Errorf("%w %s: not a namespace file", ErrNetns, path)
	}
	return &NS{path: path, f: f}, nil
}

// Path returns where the namespace was opened from ("host" for Host).
func (n *NS) Path() string { return n.path }

// IsHost reports whether n is the agent's own namespace.
func (n *NS) IsHost() bool { return n.f == nil }

// Close releases the namespace (and stops its socket thread).
func (n *NS) Close() error {
	if n.f == nil {
		return nil
	}
	var err error
	n.closeOnce.Do(func() {
		// Stop the socket thread, or keep it from starting.
		n.once.Do(func() { n.wErr = fmt.Errorf("%w %s: closed", ErrNetns, n.path) })
		if n.quit != nil {
			close(n.quit)
		}
		err = n.f.Close()
	})
	return err
}

// Inode returns the namespace's inode number (its identity in `ip netns
// identify` and /proc/PID/ns/net links).
func (n *NS) Inode() (uint64, error) {
	var st unix.Stat_t
	var err error
	if n.f == nil {
		err = unix.Stat("/proc/self/ns/net", &st)
	} else {
		err = unix.Fstat(int(n.f.Fd()), &st)
	}
	return st.Ino, err
}

// Do runs fn on an OS thread inside the namespace and returns its error.
// Sockets fn creates belong to the namespace. fn must not start
// goroutines that create sockets: they would run on other threads.
func (n *NS) Do(fn func() error) error {
	if n.f == nil {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Unlocked only when the thread is back in its own namespace.
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("%w: own namespace: %v", ErrNetns, err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("%w %s: %v", ErrNetns, n.path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it exits with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("%w: back to own namespace: %v", ErrNetns, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Listen opens a TCP listener on address inside the namespace.
func (n *NS) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	var ln net.Listener
	err := n.Do(func() error {
		var lc net.ListenConfig
		var err error
		ln, err = lc.Listen(ctx, network, address)
		return err
	})
	return ln, err
}

// Dialer dials TCP from inside a namespace with an optional SO_MARK set
// before connect.
type Dialer struct {
	NS      *NS
	Mark    uint32        // 0: no mark
	Timeout time.Duration // per connect; 0: none beyond ctx
	// Resolver resolves host names. It runs in the agent's namespace (its
	// DNS goroutines are not on the namespace thread); nil: the default.
	Resolver *net.Resolver
}

// DialContext dials network ("tcp", "tcp4", "tcp6") address from the
// namespace. A host name is resolved first and its addresses tried in turn.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	var targets []string
	if ip := net.ParseIP(host); ip != nil {
		targets = []string{address}
	} else {
		r := d.Resolver
		if r == nil {
			r = net.DefaultResolver
		}
		want := "ip"
		switch network {
		case "tcp4":
			want = "ip4"
		case "tcp6":
			want = "ip6"
		}
		ips, err := r.LookupNetIP(ctx, want, host)
		if err != nil {
			return nil, err
		}
		for _, ip := range ips {
			targets = append(targets, net.JoinHostPort(ip.Unmap().String(), port))
		}
	}
	nd := net.Dialer{Timeout: d.Timeout}
	if d.Mark != 0 {
		mark := int(d.Mark)
		nd.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	var errs []error
	for _, t := range targets {
		var c net.Conn
		var err error
		if d.NS.IsHost() {
			c, err = nd.DialContext(ctx, network, t)
		} else {
			c, err = d.dialInside(ctx, network, t)
		}
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}
