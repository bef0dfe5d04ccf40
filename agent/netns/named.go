package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Dir is where named namespaces are bound (the directory `ip netns` uses).
const Dir = "/run/netns"

// NewNamed creates a network namespace with its loopback up and binds it
// at Dir/name, so that it outlives the thread that made it and `ip netns`
// sees it. It returns the open namespace; DeleteNamed removes the name.
func NewNamed(name string) (*NS, error) {
	path := filepath.Join(Dir, name)
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNetns, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return nil, fmt.Errorf("%w: create %s: %v", ErrNetns, path, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		err = unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, "")
		if err == nil {
			var lo netlink.Link
			if lo, err = netlink.LinkByName("lo"); err == nil {
				err = netlink.LinkSetUp(lo)
			}
		}
		if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr != nil {
			errc <- errors.Join(err, serr) // thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		_ = DeleteNamed(name)
		return nil, fmt.Errorf("%w: new namespace %s: %v", ErrNetns, name, err)
	}
	return Open(path)
}

// DeleteNamed unbinds and removes Dir/name. The namespace itself goes when
// nothing else holds it (open files, processes, sockets).
func DeleteNamed(name string) error {
	path := filepath.Join(Dir, name)
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%w: unmount %s: %v", ErrNetns, path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %v", ErrNetns, err)
	}
	return nil
}
