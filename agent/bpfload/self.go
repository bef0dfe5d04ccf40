package bpfload

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// MarkControl returns a net.Dialer.Control function that puts mark on the
// socket before it connects. egret's upstream dials must use it (with
// Loader.Mark) so that connect4/6 leave them alone and the witness tracks
// them; a mark set after connect is too late for both.
func MarkControl(mark uint32) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
		})
		if err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("bpfload: SO_MARK %#x: %w", mark, serr)
		}
		return nil
	}
}

// EnterCgroup creates the cgroup v2 directory path if needed and moves the
// whole calling process into it. Sockets created afterwards (listeners,
// upstream dials) belong to it, so it is the path to give AttachSelf; an
// agent should use a cgroup of its own (for example
// /sys/fs/cgroup/unified/egret) rather than attach to a shared one.
// Sockets created before the move stay in the old cgroup.
func EnterCgroup(path string) error {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return fmt.Errorf("bpfload: cgroup %s: %w", path, err)
	}
	procs := filepath.Join(path, "cgroup.procs")
	if err := os.WriteFile(procs, []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return fmt.Errorf("bpfload: enter cgroup %s: %w", path, err)
	}
	return nil
}
