//go:build linux

package proxy

import (
	"container/heap"
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Parking: an idle keep-alive client connection holds no goroutine.
//
// A connection that has waited ParkAfter for its next request (its buffers
// already back in the pools, see waitRequest) is registered in the
// parker's epoll set and its goroutine returns, freeing its stack. When its
// socket becomes readable, or its peer closes or resets it, the parker
// starts a goroutine that continues the request loop (conn.resume); the
// request is then read by the usual non-blocking read. A connection still
// parked at the end of its idle time (IdleTimeout from the end of its last
// request) is ended by the parker. A busy connection never parks: its wait
// for the next request ends before ParkAfter, and the only cost is the
// choice of its read deadline, which it set per request anyway.
//
// One parker per process rather than one per Server: the agent runs a
// Server per pod, and a hundred epoll descriptors and goroutines would buy
// nothing, as parking happens at most once per connection and ParkAfter.
// A Server finds its own parked connections among its conns (Shutdown).
//
// The parker waits in Go's own poller, not in epoll_wait(2): an epoll
// descriptor is itself pollable, so the parker goroutine reads it as a
// non-blocking file (epoll_wait with a zero timeout when the poller says
// it is readable) and holds no thread while nothing happens. The end of
// the earliest idle time is that file's read deadline, moved earlier by a
// park that ends sooner: no timer per connection, no timer of its own, no
// eventfd to wake it.
//
// Each registration carries a token, never the descriptor's number: a
// descriptor closed and reused (or an event of a closed socket whose
// description lived on in a forked child until its exec) must not resume
// another connection. EPOLLONESHOT disarms a registration when it fires,
// so a resumed connection is not reported again while it serves; the next
// park re-arms it (EPOLL_CTL_MOD). Closing a socket removes it from the set.
type parker struct {
	ep int
	f  *os.File // ep, in Go's poller
	rc syscall.RawConn

	// The parker goroutine's.
	events []unix.EpollEvent
	n      int
	werr   error
	waitFn func(fd uintptr) bool

	mu     sync.Mutex
	tok    uint64 // the last token given
	conns  map[uint64]*conn
	due    dueHeap // parked connections by the end of their idle time
	broken bool    // the epoll descriptor failed: nothing parks
	woken  []*conn // reused by ready and sweep
	ended  []*conn
}

// parkState is a conn's part of the parker's books, guarded by parker.mu.
type parkState struct {
	tok uint64 // its registration's token while parked (from 1)
	idx int    // its index in parker.due while parked
	// registered: the socket is in the epoll set (disarmed unless parked).
	registered bool
}

var (
	parkerOnce sync.Once
	theParker  *parker
	parkerErr  error
)

// sharedParker returns the process's parker, started on first use; an
// error means idle connections are not parked (they keep their
// goroutine, as before parking existed).
func sharedParker() (*parker, error) {
	parkerOnce.Do(func() {
		theParker, parkerErr = newParker()
		if theParker != nil {
			go theParker.run()
		}
	})
	return theParker, parkerErr
}

func newParker() (*parker, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		return nil, os.NewSyscallError("fcntl", err)
	}
	f := os.NewFile(uintptr(ep), "egret-parker")
	// A deadline can be set only on a descriptor in the poller.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	p := &parker{ep: ep, f: f, rc: rc, events: make([]unix.EpollEvent, 128), conns: make(map[uint64]*conn)}
	p.waitFn = p.wait
	return p, nil
}

// park registers c, whose wait for a next request has reached ParkAfter,
// to be resumed when its socket has something to say or ended at
// c.idleUntil. It reports false when c cannot be parked; then c is still
// its caller's. Once it returns true, c is the parker's and its caller
// must not touch it.
//
// A connection of a server that is shutting down is not parked: Shutdown
// closes the idle ones itself, and its cut ends the wait of a new one with
// a deadline in the past, which must not pass for ParkAfter. Checked under
// p.mu, which Shutdown's unpark takes too: either it finds c parked, or c
// sees closing.
func (p *parker) park(c *conn) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken || c.s.closing.Load() {
		return false
	}
	p.tok++
	ev := unix.EpollEvent{
		Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT,
		Fd:     int32(uint32(p.tok)),
		Pad:    int32(uint32(p.tok >> 32)),
	}
	var err error
	cerr := c.pr.rc.Control(func(fd uintptr) {
		op := unix.EPOLL_CTL_ADD
		if c.pk.registered {
			op = unix.EPOLL_CTL_MOD
		}
		err = unix.EpollCtl(p.ep, op, int(fd), &ev)
	})
	if cerr != nil || err != nil {
		return false
	}
	c.pk.registered = true
	c.pk.tok = p.tok
	p.conns[p.tok] = c
	heap.Push(&p.due, c)
	if c.pk.idx == 0 {
		// The earliest end now: the parker's wait must end there.
		p.f.SetReadDeadline(c.idleUntil)
	}
	c.s.parkedChanged(1)
	return true
}

// unpark takes c back from the parker if it is parked, and reports
// whether it was: the caller then owns c (and starts its goroutine).
func (p *parker) unpark(c *conn) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns[c.pk.tok] != c {
		return false
	}
	p.remove(c)
	return true
}

// remove drops c from the books; p.mu is held.
func (p *parker) remove(c *conn) {
	delete(p.conns, c.pk.tok)
	heap.Remove(&p.due, c.pk.idx)
	c.s.parkedChanged(-1)
}

// run is the parker's goroutine: it resumes the connections whose sockets
// are ready and ends those whose idle time is over.
func (p *parker) run() {
	for {
		err := p.rc.Read(p.waitFn)
		switch {
		case err == nil && p.werr == nil:
			p.ready()
		case errors.Is(err, os.ErrDeadlineExceeded):
			p.sweep()
		default:
			// Cannot happen with a valid epoll descriptor; if it does,
			// nothing parks any more and the parked are resumed (their
			// goroutines wait as before parking existed).
			p.fail()
			return
		}
	}
}

// wait is run's read: the events ready now, or false (wait for the
// poller) when there are none.
func (p *parker) wait(fd uintptr) bool {
	for {
		n, err := unix.EpollWait(int(fd), p.events, 0)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			p.n, p.werr = 0, err
			return true
		case n == 0:
			return false
		}
		p.n, p.werr = n, nil
		return true
	}
}

// ready resumes the connections of the events read.
func (p *parker) ready() {
	p.mu.Lock()
	woken := p.woken[:0]
	for _, ev := range p.events[:p.n] {
		tok := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
		if c, ok := p.conns[tok]; ok {
			p.remove(c)
			woken = append(woken, c)
		}
	}
	p.mu.Unlock()
	for i, c := range woken {
		go c.resume()
		woken[i] = nil
	}
	p.woken = woken[:0]
}

// sweep ends the parked connections whose idle time is over, as a
// connection waiting with its goroutine would end at its read deadline,
// and sets the deadline of the next.
func (p *parker) sweep() {
	p.mu.Lock()
	now := time.Now()
	ended := p.ended[:0]
	for len(p.due) > 0 && !p.due[0].idleUntil.After(now) {
		c := p.due[0]
		p.remove(c)
		ended = append(ended, c)
	}
	var next time.Time
	if len(p.due) > 0 {
		next = p.due[0].idleUntil
	}
	p.f.SetReadDeadline(next)
	p.mu.Unlock()
	for i, c := range ended {
		c.end()
		ended[i] = nil
	}
	p.ended = ended[:0]
}

// fail stops parking and resumes every parked connection.
func (p *parker) fail() {
	p.mu.Lock()
	p.broken = true
	var woken []*conn
	for len(p.due) > 0 {
		c := p.due[0]
		p.remove(c)
		woken = append(woken, c)
	}
	p.mu.Unlock()
	for _, c := range woken {
		go c.resume()
	}
}

// dueHeap orders parked connections by the end of their idle time.
type dueHeap []*conn

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].idleUntil.Before(h[j].idleUntil) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pk.idx, h[j].pk.idx = i, j
}

func (h *dueHeap) Push(x any) {
	c := x.(*conn)
	c.pk.idx = len(*h)
	*h = append(*h, c)
}

func (h *dueHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return c
}
