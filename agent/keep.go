package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ListenerKeeper keeps duplicates of the pods' listeners outside the
// agent (keeper.Client, talking to `egret keeper`), so that connects the
// kernel queued on them survive the agent's death and the next agent
// serves them.
type ListenerKeeper interface {
	// Put hands over a duplicate of l's socket under name.
	Put(name string, l syscall.Conn) error
	// Drop closes the keeper's duplicate of that name.
	Drop(name string) error
}

// ListenerName names a pod's listener to the keeper: the pod's network
// namespace (its inode) and the listener's address.
func ListenerName(netnsInode uint64, addr netip.AddrPort) string {
	return fmt.Sprintf("netns:%d %s", netnsInode, addr)
}

// listen opens a pod listener on addr in the pod's namespace, or adopts
// the one the keeper held for an earlier agent (with the connects queued
// on it), and hands a new one to the keeper. It returns the listener and
// its keeper name ("" when there is no keeper).
func (a *Agent) listen(ps *podState, network string, addr netip.AddrPort) (net.Listener, string, error) {
	if a.cfg.Keeper == nil && len(a.cfg.Kept) == 0 {
		ln, err := ps.ns.Listen(context.Background(), network, addr.String())
		return ln, "", err
	}
	ino, err := ps.ns.Inode()
	if err != nil {
		return nil, "", fmt.Errorf("namespace %s: %w", ps.ns.Path(), err)
	}
	name := ListenerName(ino, addr)
	a.mu.Lock()
	f := a.cfg.Kept[name]
	delete(a.cfg.Kept, name)
	a.mu.Unlock()
	if f != nil {
		ln, err := adopt(f, ino, addr)
		f.Close()
		if err == nil {
			a.log.Info("adopted the listener egret keeper held", "pod", ps.pod.Name, "listen", addr.String())
			return ln, name, nil
		}
		a.log.Warn("listener held by egret keeper not adopted; opening a new one", "pod", ps.pod.Name, "listen", addr.String(), "err", err)
		a.dropKept(name)
	}
	ln, err := ps.ns.Listen(context.Background(), network, addr.String())
	if err != nil {
		return nil, "", err
	}
	if a.cfg.Keeper != nil {
		if err := a.cfg.Keeper.Put(name, ln.(syscall.Conn)); err != nil {
			// Serving goes on; only a kill would cost the queued connects.
			a.log.Warn("egret keeper not given the listener", "pod", ps.pod.Name, "listen", addr.String(), "err", err)
		}
	}
	return ln, name, nil
}

// adopt turns a listener the keeper held into a net.Listener, once it is
// shown to be a TCP listener on addr in the namespace of inode ino.
func adopt(f *os.File, ino uint64, addr netip.AddrPort) (net.Listener, error) {
	nsfd, err := unix.IoctlRetInt(int(f.Fd()), unix.SIOCGSKNS)
	if err != nil {
		return nil, fmt.Errorf("its namespace (SIOCGSKNS): %w", err)
	}
	var st unix.Stat_t
	err = unix.Fstat(nsfd, &st)
	unix.Close(nsfd)
	if err != nil {
		return nil, err
	}
	if st.Ino != ino {
		return nil, fmt.Errorf("it is in network namespace %d, not the pod's %d", st.Ino, ino)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	if got := addrPortOf(ln.Addr()); got != addr {
		ln.Close()
		return nil, fmt.Errorf("it listens on %s, not %s", ln.Addr(), addr)
	}
	return ln, nil
}

// dropKept tells the keeper to close a listener (logged if it cannot).
func (a *Agent) dropKept(name string) {
	if a.cfg.Keeper == nil || name == "" {
		return
	}
	if err := a.cfg.Keeper.Drop(name); err != nil {
		a.log.Warn("egret keeper not told to drop a listener", "listener", name, "err", err)
	}
}

// dropUnadopted closes the kept listeners no pod adopted (their pods went
// while no agent ran), here and in the keeper: once the pod source has
// listed its pods, none will.
func (a *Agent) dropUnadopted() {
	a.mu.Lock()
	kept := a.cfg.Kept
	a.cfg.Kept = nil
	a.mu.Unlock()
	for name, f := range kept {
		f.Close()
		a.dropKept(name)
		a.log.Info("closed a listener egret keeper held for a pod that is gone", "listener", name)
	}
}
