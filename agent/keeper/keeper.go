// Package keeper holds the agent's listening sockets across the agent's
// death, so that connects the kernel queued on them survive it.
//
// When the agent is killed (SIGKILL, an OOM kill) its descriptors close.
// A pod's listener closing resets every connect queued on it: redirected a
// moment before the kill, accepted by the kernel, never by egret. `egret
// keeper` (a second container of the agent's pod, started first and
// stopped last) owns a unix socket; the agent connects to it (Dial), hands
// it a duplicate of each pod's listener (Client.Put, SCM_RIGHTS) and tells
// it when one goes (Client.Drop). When the agent dies the keeper still
// holds the listeners, so their accept queues stay; it sees the agent's
// connection close and waits for the next agent, which gets them back
// (Dial returns them), adopts them and serves what was queued. New
// connects go direct meanwhile: the eBPF connect programs redirect only
// while an agent runs (bpfload's egret_alive).
//
// The hold is bounded (Keeper.Hold): a connect queued on a kept listener
// waits for the next agent, and the kubelet may take a while to start one
// (a crash-looping container waits up to 5 minutes). When no agent has
// come within the hold, the keeper closes what it holds: each queued
// connect is reset (a prompt, truthful failure for its client instead of
// a wait that no client timeout allows for), and the next agent makes new
// listeners.
//
// One agent at a time: the keeper serves one connection until it ends,
// then accepts the next. Only a peer of the keeper's own effective uid is
// served (SO_PEERCRED), on both ends.
package keeper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Message kinds: the first byte of each packet; the rest is a name.
const (
	opPut  = 'P' // name, with one descriptor: keep it (replacing one of that name)
	opDrop = 'D' // name: close and forget it
	opEnd  = 'E' // keeper to agent: every held listener was sent
	opSync = 'S' // agent to keeper, answered with opSync: all before is done
)

// MaxName is the longest name a listener may have.
const MaxName = 1024

// Sentinel errors.
var (
	// ErrPeer: the other end runs as another user.
	ErrPeer = errors.New("keeper: peer of another uid refused")
	// ErrProtocol: a message the other end should not have sent.
	ErrProtocol = errors.New("keeper: protocol error")
)

// Keeper holds listeners for the agent. Create with Listen, then Serve.
type Keeper struct {
	ln     *net.UnixListener
	path   string
	log    *slog.Logger
	file   os.FileInfo // the socket's file at path
	unlink sync.Once   // closeListener

	// Hold is how long the listeners of a dead agent are kept for the
	// next one; 0 keeps them until it comes. Set it before Serve.
	Hold time.Duration

	mu    sync.Mutex
	held  map[string]*os.File
	agent bool // an agent is connected: nothing to release
}

// DefaultHold is the hold `egret keeper` uses unless told: long enough for
// the kubelet's immediate restart of a killed container and the agent's
// start (about 2 s measured on a real node), short of the 5 s and more that
// HTTP clients commonly allow a request.
const DefaultHold = 3 * time.Second

// Listen makes the keeper's socket at path (a stale socket file there is
// replaced), readable and writable by its owner only. The socket is bound
// and listening under a temporary name first, then renamed to path: a
// socket file at path always accepts (DialWait, woken by its appearance,
// is never refused by a socket bound and not yet listening).
func Listen(path string, log *slog.Logger) (*Keeper, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != os.ModeSocket {
		return nil, fmt.Errorf("keeper: %s exists and is not a socket", path)
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	_ = os.Remove(tmp) // left by a keeper of this pid that died here
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: tmp, Net: "unixpacket"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	// Closing the listener unlinks the name it was bound to, which is
	// gone: close unlinks path itself.
	ln.SetUnlinkOnClose(false)
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("keeper: %w", err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("keeper: %w", err)
	}
	return &Keeper{ln: ln, path: path, file: fi, log: log, held: map[string]*os.File{}}, nil
}

// closeListener closes the keeper's socket and removes its file, unless
// another keeper's socket has replaced it there.
func (k *Keeper) closeListener() {
	k.unlink.Do(func() {
		k.ln.Close()
		if fi, err := os.Lstat(k.path); err == nil && os.SameFile(fi, k.file) {
			os.Remove(k.path)
		}
	})
}

// Path is the keeper's socket.
func (k *Keeper) Path() string { return k.path }

// Held returns the names of the listeners held, sorted.
func (k *Keeper) Held() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]string, 0, len(k.held))
	for n := range k.held {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Serve serves agents, one at a time, until ctx ends; then it closes the
// socket and every listener held (the agent's pod is going: nothing is
// left to keep them for).
func (k *Keeper) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, k.closeListener)
	defer stop()
	defer k.closeAll()
	var expire *time.Timer
	for {
		c, err := k.ln.AcceptUnix()
		if err == nil {
			// A release that has not yet taken the lock does nothing
			// now: the next agent gets every listener held or none.
			k.mu.Lock()
			k.agent = true
			k.mu.Unlock()
		}
		if expire != nil {
			expire.Stop()
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("keeper: accept: %w", err)
		}
		done := context.AfterFunc(ctx, func() { c.Close() })
		if err := k.serve(c); err != nil && ctx.Err() == nil {
			k.log.Warn("agent connection ended", "err", err)
		}
		done()
		c.Close()
		if ctx.Err() != nil {
			return nil
		}
		k.mu.Lock()
		k.agent = false
		k.mu.Unlock()
		k.log.Info("agent gone: holding its listeners for the next one", "listeners", len(k.Held()), "hold", k.Hold)
		if k.Hold > 0 {
			expire = time.AfterFunc(k.Hold, k.release)
		}
	}
}

// release closes every listener held (no agent came within the hold):
// the connects queued on them are reset.
func (k *Keeper) release() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.agent || len(k.held) == 0 {
		return
	}
	for n, f := range k.held {
		f.Close()
		delete(k.held, n)
	}
	k.log.Warn("no agent within the hold: listeners closed, connects queued on them reset", "hold", k.Hold)
}

func (k *Keeper) closeAll() {
	k.closeListener()
	k.mu.Lock()
	defer k.mu.Unlock()
	for n, f := range k.held {
		f.Close()
		delete(k.held, n)
	}
}

// serve serves one agent: sends what is held, then applies its messages
// until its connection ends.
func (k *Keeper) serve(c *net.UnixConn) error {
	if err := checkPeer(c); err != nil {
		return err
	}
	k.mu.Lock()
	names := make([]string, 0, len(k.held))
	for n := range k.held {
		names = append(names, n)
	}
	sort.Strings(names)
	var err error
	for _, n := range names {
		if err = send(c, opPut, n, k.held[n]); err != nil {
			break
		}
	}
	k.mu.Unlock()
	if err != nil {
		return err
	}
	if err := send(c, opEnd, "", nil); err != nil {
		return err
	}
	k.log.Info("agent connected", "listeners_handed_back", len(names))
	for {
		op, name, f, err := recv(c)
		if err != nil {
			if errors.Is(err, errEOF) {
				return nil
			}
			return err
		}
		switch op {
		case opPut:
			if f == nil {
				return fmt.Errorf("%w: put %q without a descriptor", ErrProtocol, name)
			}
			if err := checkListener(f); err != nil {
				f.Close()
				return fmt.Errorf("%w: put %q: %v", ErrProtocol, name, err)
			}
			k.mu.Lock()
			if old := k.held[name]; old != nil {
				old.Close()
			}
			k.held[name] = f
			k.mu.Unlock()
		case opDrop:
			k.mu.Lock()
			if f := k.held[name]; f != nil {
				f.Close()
				delete(k.held, name)
			}
			k.mu.Unlock()
		case opSync:
			if err := send(c, opSync, "", nil); err != nil {
				return err
			}
		default:
			if f != nil {
				f.Close()
			}
			return fmt.Errorf("%w: message %q", ErrProtocol, op)
		}
	}
}

// checkListener: only listening TCP sockets are kept.
func checkListener(f *os.File) error {
	fd := int(f.Fd())
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("not a socket: %v", err)
	}
	acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil || typ != unix.SOCK_STREAM || acc != 1 {
		return errors.New("not a listening stream socket")
	}
	return nil
}

// checkPeer refuses a peer that runs as another effective uid.
func checkPeer(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("keeper: SO_PEERCRED: %w", cerr)
	}
	if cred.Uid != uint32(os.Geteuid()) {
		return fmt.Errorf("%w: pid %d uid %d, want uid %d", ErrPeer, cred.Pid, cred.Uid, os.Geteuid())
	}
	return nil
}

var errEOF = errors.New("keeper: connection closed")

// send writes one message, with f's descriptor if f is not nil.
func send(c *net.UnixConn, op byte, name string, f *os.File) error {
	if len(name) > MaxName {
		return fmt.Errorf("keeper: name of %d bytes, at most %d", len(name), MaxName)
	}
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	_, _, err := c.WriteMsgUnix(append([]byte{op}, name...), oob, nil)
	if f != nil {
		// f's descriptor must stay open until the kernel took its
		// reference (WriteMsgUnix returned).
		runtime.KeepAlive(f)
	}
	if err != nil {
		return fmt.Errorf("keeper: send: %w", err)
	}
	return nil
}

// recv reads one message; f is the descriptor that came with it, if any.
func recv(c *net.UnixConn) (op byte, name string, f *os.File, err error) {
	buf := make([]byte, 1+MaxName)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if errors.Is(err, io.EOF) {
		return 0, "", nil, errEOF
	}
	if err != nil {
		return 0, "", nil, fmt.Errorf("keeper: receive: %w", err)
	}
	var fds []int
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return 0, "", nil, fmt.Errorf("%w: control message: %v", ErrProtocol, perr)
		}
		for _, m := range msgs {
			got, rerr := unix.ParseUnixRights(&m)
			if rerr == nil {
				fds = append(fds, got...)
			}
		}
	}
	if n == 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return 0, "", nil, errEOF
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || len(fds) > 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return 0, "", nil, fmt.Errorf("%w: message truncated or with %d descriptors", ErrProtocol, len(fds))
	}
	if len(fds) == 1 {
		f = os.NewFile(uintptr(fds[0]), string(buf[1:n]))
	}
	return buf[0], string(buf[1:n]), f, nil
}

// Client is the agent's end. Its methods may be called concurrently.
type Client struct {
	mu sync.Mutex
	c  *net.UnixConn
}

// Dial connects to the keeper at path, waiting up to timeout for it to
// finish with an earlier agent, and returns the listeners it holds, by
// name: the caller owns them (closes those it does not adopt, and Drops
// their names).
func Dial(path string, timeout time.Duration) (*Client, map[string]*os.File, error) {
	d := net.Dialer{Timeout: timeout}
	nc, err := d.Dial("unixpacket", path)
	if err != nil {
		return nil, nil, fmt.Errorf("keeper: %w", err)
	}
	c := nc.(*net.UnixConn)
	if err := checkPeer(c); err != nil {
		c.Close()
		return nil, nil, err
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	held := map[string]*os.File{}
	fail := func(err error) (*Client, map[string]*os.File, error) {
		c.Close()
		for _, f := range held {
			f.Close()
		}
		return nil, nil, err
	}
	for {
		op, name, f, err := recv(c)
		if err != nil {
			if errors.Is(err, errEOF) {
				err = fmt.Errorf("keeper: %s closed the connection (serving another agent, or refused this one)", path)
			}
			return fail(err)
		}
		if op == opEnd {
			break
		}
		if op != opPut || f == nil {
			if f != nil {
				f.Close()
			}
			return fail(fmt.Errorf("%w: message %q from the keeper", ErrProtocol, op))
		}
		held[name] = f
	}
	_ = c.SetReadDeadline(time.Time{})
	return &Client{c: c}, held, nil
}

// Put hands the keeper a duplicate of l's socket under name (replacing one
// of that name).
func (c *Client) Put(name string, l syscall.Conn) error {
	rc, err := l.SyscallConn()
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var serr error
	if err := rc.Control(func(fd uintptr) {
		_, _, serr = c.c.WriteMsgUnix(append([]byte{opPut}, name...), unix.UnixRights(int(fd)), nil)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("keeper: put %s: %w", name, serr)
	}
	return nil
}

// Drop tells the keeper to close the listener of that name.
func (c *Client) Drop(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return send(c.c, opDrop, name, nil)
}

// Sync returns once the keeper has applied every Put and Drop before it.
func (c *Client) Sync(timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := send(c.c, opSync, "", nil); err != nil {
		return err
	}
	_ = c.c.SetReadDeadline(time.Now().Add(timeout))
	defer c.c.SetReadDeadline(time.Time{})
	op, _, f, err := recv(c.c)
	if f != nil {
		f.Close()
	}
	if err != nil {
		return err
	}
	if op != opSync {
		return fmt.Errorf("%w: message %q in answer to a sync", ErrProtocol, op)
	}
	return nil
}

// Close ends the connection: the keeper keeps what it holds for the next
// agent.
func (c *Client) Close() error { return c.c.Close() }

// DialWait is Dial, waiting up to timeout for the keeper's socket to
// appear (the keeper may start after the agent): while path is missing, or
// is a stale socket nobody listens on, it waits for a socket to be made
// there (inotify), not on a clock.
func DialWait(path string, timeout time.Duration) (*Client, map[string]*os.File, error) {
	deadline := time.Now().Add(timeout)
	for {
		c, held, err := Dial(path, time.Until(deadline))
		if err == nil || !(errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)) {
			return c, held, err
		}
		if werr := waitCreated(path, time.Until(deadline)); werr != nil {
			return nil, nil, fmt.Errorf("%w (waited %v for it)", err, timeout)
		}
	}
}

// waitCreated returns once a file named path is created (or moved) in its
// directory, or an error after d. It returns at once if path is a socket
// someone listens on by the time the watch is set.
func waitCreated(path string, d time.Duration) error {
	if d <= 0 {
		return os.ErrDeadlineExceeded
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		return err
	}
	// Made between the failed dial and the watch?
	if c, err := net.Dial("unixpacket", path); err == nil {
		c.Close()
		return nil
	}
	end := time.Now().Add(d)
	buf := make([]byte, 4096)
	for {
		left := time.Until(end)
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		if n <= 0 {
			continue
		}
		m, err := unix.Read(fd, buf)
		if err != nil {
			continue
		}
		for off := 0; off+unix.SizeofInotifyEvent <= m; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			if name == filepath.Base(path) {
				return nil
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}
