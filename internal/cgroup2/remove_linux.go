package cgroup2

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// ErrPopulated: a cgroup still had processes (in it or below it) when the
// time to wait for them ran out.
var ErrPopulated = errors.New("cgroup2: still populated")

// Remove removes the cgroup directory dir once no process is left in it or
// below it, waiting up to timeout for the last ones to exit (after a write
// to its cgroup.kill, say). The wait is on the kernel's event, not a poll:
// cgroup.events is modified when "populated" changes (Linux 4.5), watched
// with inotify. A dir that does not exist is removed already.
func Remove(dir string, timeout time.Duration) error {
	if err := WaitEmpty(dir, timeout); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("cgroup2: remove %s: %w", dir, err)
	}
	return nil
}

// WaitEmpty waits until cgroup.events of dir says "populated 0", up to
// timeout (ErrPopulated then).
func WaitEmpty(dir string, timeout time.Duration) error {
	events := filepath.Join(dir, "cgroup.events")
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("cgroup2: inotify: %w", err)
	}
	defer unix.Close(fd)
	// Watch before the first read: a change between them is not lost.
	if _, err := unix.InotifyAddWatch(fd, events, unix.IN_MODIFY); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("cgroup2: %s: %w", dir, os.ErrNotExist)
		}
		return fmt.Errorf("cgroup2: watch %s: %w", events, err)
	}
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 4096)
	for {
		b, err := os.ReadFile(events)
		if err != nil {
			return fmt.Errorf("cgroup2: %w", err)
		}
		if populated0(b) {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("%w: %s after %v", ErrPopulated, dir, timeout)
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, int(left.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("cgroup2: poll: %w", err)
		}
		// Drain the events read; the file says what is true now.
		for {
			if _, err := unix.Read(fd, buf); err != nil {
				break
			}
		}
	}
}

func populated0(events []byte) bool {
	for _, line := range bytes.Split(events, []byte("\n")) {
		if bytes.Equal(bytes.TrimSpace(line), []byte("populated 0")) {
			return true
		}
	}
	return false
}
