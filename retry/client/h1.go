package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/h1"
	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/witness"
)

// Why an HTTP/1.1 client of our own rather than net/http's Transport: an
// attempt must be exactly one dispatch on one connection, and it must be
// cheap. net/http's Transport replays requests on its own (see Transport),
// and runs every connection on two goroutines of its own that hand each
// request and response back and forth; in a proxy that relays thousands of
// small requests a second, those hand-offs cost more than the proxying.
// h1Pool writes a request and reads its response on the caller's
// goroutine, never moves a request to another connection once a byte of it
// was written, and checks an idle connection for an upstream close before
// it hands it out (a connection found closed is dropped before the request
// is assigned to it: no attempt is spent on it).

// defaultMaxResponseHeaderBytes bounds a response's status line and header
// fields when HTTPOptions.MaxResponseHeaderBytes is 0.
const defaultMaxResponseHeaderBytes = 1 << 20

// Sizes of a connection's buffers: a request head and a body of up to about
// 12 KiB leave in one write(2); larger bodies are written while the response
// is read (the upstream may answer before it has read them).
const (
	h1ReadBuffer  = 4 << 10
	h1WriteBuffer = 16 << 10
	h1SyncBody    = 12 << 10
)

// errResponseHeaderTooLarge: the upstream's response head exceeded
// MaxResponseHeaderBytes.
var errResponseHeaderTooLarge = errors.New("response header exceeds the limit")

// h1Pool pools HTTP/1.1 connections (plain and TLS) by scheme and address.
type h1Pool struct {
	t *HTTPTransport

	mu       sync.Mutex
	idle     map[poolKey][]*h1Conn // most recently used last
	open     map[poolKey]int       // connections per key, counted with MaxConnsPerHost
	waiters  map[poolKey][]chan struct{}
	sweeping bool
	// born numbers the connections dialled; retired[key] is the number of
	// the last one dialled when its address left (closeAddr): a busy
	// connection of key born no later never goes back to idle. live counts
	// a retired key's connections, so that the key is forgotten with its
	// last one.
	born    atomic.Uint64
	retired map[poolKey]uint64
	live    map[poolKey]int
	// closing is held by a sweep and by closeIdle from taking connections
	// out of idle until they are closed: once closeIdle returns, no sweep
	// still closes a connection (whose witness its owner may then close).
	closing sync.Mutex
	// idled, when set (by tests), is called each time a connection goes
	// back to idle: a body's last write may put it back after the
	// response ended, and a test that counts connections waits for it.
	idled func()
	// bounds: per upstream, how long a connection may have been idle and
	// still carry a request that is not safely idempotent.
	bounds idleBounds
	// clock, when set (HTTPOptions.Clock), replaces time.Now for idle times.
	clock func() time.Time
}

func (p *h1Pool) now() time.Time {
	if p.clock != nil {
		return p.clock()
	}
	return time.Now()
}

// poolKey names the connections that can carry a request: scheme and
// host:port.
type poolKey struct{ scheme, addr string }

func newH1Pool(t *HTTPTransport) *h1Pool {
	return &h1Pool{t: t, idle: make(map[poolKey][]*h1Conn), open: make(map[poolKey]int), waiters: make(map[poolKey][]chan struct{}),
		retired: make(map[poolKey]uint64), live: make(map[poolKey]int)}
}

// h1Conn is one upstream connection; it carries one request at a time.
type h1Conn struct {
	p       *h1Pool
	key     poolKey
	born    uint64   // h1Pool.born when it was dialled
	nc      net.Conn // a *attempt.Conn, or a *tls.Conn over one
	wc      *attempt.Conn
	tls     bool
	lr      limitedReader
	br      *bufio.Reader
	bw      *bufio.Writer
	peek    *peeker
	scratch headScratch
	// interrupt (made once) ends blocked I/O when an exchange's context ends.
	interrupt func()
	used      bool
	idleAt    time.Time
	closed    atomic.Bool
	// bodySent: the body written beside the response's read has all left
	// (its goroutine is about to report).
	bodySent atomic.Bool
	// readingSource: that goroutine waits on the body's source.
	readingSource atomic.Bool
	// sourceDone: that goroutine has read the source to its end; what is
	// left is to write it.
	sourceDone atomic.Bool
	// writeState: that goroutine is writing (bodyWriting), has ended
	// (bodyWritten), or was handed the connection by the response's end
	// (bodyHandedOff, see h1Body.end).
	writeState atomic.Int32
	// writeErr: that goroutine failed before the response head came, and
	// stopped its read.
	writeErr atomic.Pointer[error]
	// one is bodyEnds' read past a sized body (a local would escape).
	one [1]byte
}

// h1Conn.writeState values.
const (
	bodyWriting int32 = iota
	bodyWritten
	bodyHandedOff
)

// limitedReader reads the connection, failing once more than n bytes were
// read while n >= 0 (the response head's limit); n < 0: no limit.
type limitedReader struct {
	c net.Conn
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return l.c.Read(p)
	}
	if l.n == 0 {
		return 0, errResponseHeaderTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.c.Read(p)
	l.n -= int64(n)
	return n, err
}

func (c *h1Conn) close() {
	if c.closed.Swap(true) {
		return
	}
	c.nc.Close()
	c.p.release(c.key)
	c.p.forget(c)
}

// forget counts a closed connection out of its key's.
func (p *h1Pool) forget(c *h1Conn) {
	p.mu.Lock()
	if n := p.live[c.key]; n <= 1 {
		delete(p.live, c.key)
		delete(p.retired, c.key)
	} else {
		p.live[c.key] = n - 1
	}
	p.mu.Unlock()
}

// closeAddr closes the idle connections to addr, and makes the busy ones
// close when their exchange ends rather than go back to idle: the address
// left its upstream (an endpoint left its Service), so no connection to it
// is used again. A connection dialled to addr after this call is pooled as
// usual (the address came back).
func (p *h1Pool) closeAddr(addr string) {
	p.closing.Lock()
	defer p.closing.Unlock()
	var old []*h1Conn
	p.mu.Lock()
	for _, scheme := range [...]string{"http", "https"} {
		key := poolKey{scheme, addr}
		old = append(old, p.idle[key]...)
		delete(p.idle, key)
		if p.live[key] > 0 {
			p.retired[key] = p.born.Load()
		}
	}
	p.mu.Unlock()
	for _, c := range old {
		c.close()
	}
}

// stale reports whether an idle connection can no longer carry a request:
// the upstream closed or reset it, or (plain HTTP) sent bytes nobody asked
// for. Under TLS pending bytes may be a session ticket, so only an end of
// stream counts there.
func (c *h1Conn) stale() bool {
	if c.wc == nil || c.wc.Raw() == nil {
		return false
	}
	if stale, decided := c.wc.CheckIdle(c.tls); decided {
		return stale
	}
	if c.peek == nil {
		c.peek = newPeeker()
	}
	fin, pending := c.peek.state(c.wc.Raw())
	return fin || (pending && !c.tls)
}

// release forgets a closed connection of key and wakes one waiter.
func (p *h1Pool) release(key poolKey) {
	if p.t.opts.MaxConnsPerHost <= 0 {
		return
	}
	p.mu.Lock()
	p.open[key]--
	if p.open[key] <= 0 {
		delete(p.open, key)
	}
	if w := p.waiters[key]; len(w) > 0 {
		close(w[0])
		p.waiters[key] = w[1:]
		if len(p.waiters[key]) == 0 {
			delete(p.waiters, key)
		}
	}
	p.mu.Unlock()
}

// get returns an idle connection of key that is still open, or reserves the
// right to dial a new one (nil, nil), waiting for one while MaxConnsPerHost
// are open. A risky request (not safely idempotent) gets only a connection
// idle for less than the upstream's learned bound (see idleBounds), which
// get returns; the others get any live one, and no bound is looked up.
func (p *h1Pool) get(ctx context.Context, key poolKey, risky bool) (*h1Conn, attempt.IdleBound, error) {
	limit := p.t.opts.MaxConnsPerHost
	var bound attempt.IdleBound
	looked := false
	for {
		p.mu.Lock()
		if l := p.idle[key]; len(l) > 0 {
			c := l[len(l)-1]
			l[len(l)-1] = nil
			p.idle[key] = l[:len(l)-1]
			p.mu.Unlock()
			now := p.now()
			idle := now.Sub(c.idleAt)
			if risky && !looked {
				bound, looked = p.bounds.bound(key, now), true
			}
			if idle > p.t.opts.IdleConnTimeout || bound.Source != attempt.IdleBoundNone && idle >= bound.Limit {
				// Expired, or too close to the upstream's own timeout to
				// risk the request on (the most recent idle connection
				// is last: the others are older still).
				c.close()
				continue
			}
			// Checked outside the lock: the peek is a system call.
			if c.stale() {
				p.bounds.closed(key, idle, now)
				c.close()
				continue
			}
			return c, bound, nil
		}
		if limit <= 0 || p.open[key] < limit {
			if limit > 0 {
				p.open[key]++
			}
			p.mu.Unlock()
			if risky && !looked {
				bound = p.bounds.bound(key, p.now())
			}
			return nil, bound, nil
		}
		w := make(chan struct{})
		p.waiters[key] = append(p.waiters[key], w)
		p.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			p.mu.Lock()
			l := p.waiters[key]
			for i, x := range l {
				if x == w {
					p.waiters[key] = append(l[:i], l[i+1:]...)
					break
				}
			}
			p.mu.Unlock()
			select {
			case <-w: // woken meanwhile: pass it on
				p.wakeOne(key)
			default:
			}
			return nil, bound, ctx.Err()
		}
	}
}

func (p *h1Pool) wakeOne(key poolKey) {
	p.mu.Lock()
	if w := p.waiters[key]; len(w) > 0 {
		close(w[0])
		p.waiters[key] = w[1:]
	}
	p.mu.Unlock()
}

// put returns a connection whose exchange ended cleanly to the pool.
func (p *h1Pool) put(c *h1Conn) {
	c.used = true
	c.idleAt = p.now()
	p.mu.Lock()
	r, retired := p.retired[c.key]
	if len(p.idle[c.key]) >= p.t.opts.MaxIdleConnsPerHost || retired && c.born <= r {
		p.mu.Unlock()
		c.close()
		return
	}
	p.idle[c.key] = append(p.idle[c.key], c)
	if w := p.waiters[c.key]; len(w) > 0 {
		close(w[0])
		p.waiters[c.key] = w[1:]
	}
	sweep := !p.sweeping
	p.sweeping = true
	p.mu.Unlock()
	if sweep {
		time.AfterFunc(p.t.opts.IdleConnTimeout, p.sweep)
	}
	if p.idled != nil {
		p.idled()
	}
}

// sweep closes the connections idle for longer than IdleConnTimeout, and
// runs again while any are idle.
func (p *h1Pool) sweep() {
	var old []*h1Conn
	p.closing.Lock()
	defer p.closing.Unlock()
	p.mu.Lock()
	left := false
	for key, l := range p.idle {
		live := l[:0]
		for _, c := range l {
			if p.now().Sub(c.idleAt) > p.t.opts.IdleConnTimeout {
				old = append(old, c)
				continue
			}
			live = append(live, c)
		}
		clear(l[len(live):])
		if len(live) == 0 {
			delete(p.idle, key)
		} else {
			p.idle[key] = live
			left = true
		}
	}
	p.sweeping = left
	p.mu.Unlock()
	for _, c := range old {
		c.close()
	}
	if left {
		time.AfterFunc(p.t.opts.IdleConnTimeout/2, p.sweep)
	}
}

func (p *h1Pool) closeIdle() {
	p.closing.Lock()
	defer p.closing.Unlock()
	p.mu.Lock()
	var all []*h1Conn
	for key, l := range p.idle {
		all = append(all, l...)
		delete(p.idle, key)
	}
	p.mu.Unlock()
	for _, c := range all {
		c.close()
	}
}

// dial opens a new connection for key; w is the witness of the attempt
// it is dialled for (nil: none).
func (p *h1Pool) dial(ctx context.Context, key poolKey, w witness.Witness) (*h1Conn, error) {
	var nc net.Conn
	var err error
	if key.scheme == "https" {
		nc, err = p.t.dialTLSH1(ctx, "tcp", key.addr, w)
	} else {
		nc, err = p.t.dialPlain(ctx, "tcp", key.addr, w)
	}
	if err != nil {
		if p.t.opts.MaxConnsPerHost > 0 {
			p.release(key)
		}
		return nil, err
	}
	c := &h1Conn{p: p, key: key, born: p.born.Add(1), nc: nc, wc: attempt.ConnOf(nc), tls: key.scheme == "https"}
	p.mu.Lock()
	p.live[key]++
	p.mu.Unlock()
	c.lr.c = nc
	c.interrupt = func() { nc.SetDeadline(aLongTimeAgo) }
	c.br = bufio.NewReaderSize(&c.lr, h1ReadBuffer)
	c.bw = bufio.NewWriterSize(nc, h1WriteBuffer)
	return c, nil
}

// roundTrip runs one attempt of req on an HTTP/1.1 connection, its header
// fields in order (see writeFields). a is the runner's attempt (nil: none,
// when HTTPTransport is used on its own). It never retries and never moves
// the request to another connection.
func (p *h1Pool) roundTrip(req *http.Request, a *attempt.Ctx, order []string) (*http.Response, error) {
	if err := validHeader(req, order); err != nil {
		return nil, err
	}
	addr := CanonicalAddr(req.URL)
	key := poolKey{req.URL.Scheme, addr}
	ctx := req.Context()
	h := hooks{a: a, ct: httptrace.ContextClientTrace(ctx)}
	if a != nil {
		h.at = a.Trace()
	}
	if h.ct != nil && h.ct.GetConn != nil {
		h.ct.GetConn(addr)
	}
	risky := !idempotentMethod(req.Method)
	if h.at != nil {
		risky = h.at.Risky
	}
	c, bound, err := p.get(ctx, key, risky)
	if err != nil {
		return nil, err
	}
	if c == nil {
		// The dialers (net.Dialer's DNS and connect, tracedDial, the TLS
		// handshake) report through httptrace only.
		dctx := ctx
		var w witness.Witness
		if h.at != nil {
			dctx, w = httptrace.WithClientTrace(ctx, h.at.ClientTrace()), h.at.Witness
		}
		if c, err = p.dial(dctx, key, w); err != nil {
			return nil, err
		}
	}
	info := httptrace.GotConnInfo{Conn: c.nc, Reused: c.used}
	if c.used {
		info.WasIdle, info.IdleTime = true, p.now().Sub(c.idleAt)
	}
	if h.at != nil {
		h.at.SetIdleBound(bound)
	}
	h.gotConn(info)
	resp, err := c.exchange(ctx, req, h, order)
	switch {
	case err == nil:
		p.bounds.keepAlive(key, resp.Header)
	case info.Reused && peerClosed(err):
		// The upstream closed the idle connection as the request came.
		p.bounds.closed(key, info.IdleTime, p.now())
	}
	return resp, err
}

// idempotentMethod is RFC 9110's list, for HTTPTransport used on its own
// (the runner resolves idempotency by policy and says so).
func idempotentMethod(m string) bool {
	switch m {
	case "", "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}

// peerClosed reports whether err is the upstream's end of the connection:
// an end of stream or a reset before a response head.
func peerClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// hooks are what an exchange reports to: the runner's attempt (a, its
// trace at) directly, and any httptrace.ClientTrace of the request's
// context.
type hooks struct {
	a  *attempt.Ctx
	at *attempt.Trace
	ct *httptrace.ClientTrace
}

func (h hooks) gotConn(info httptrace.GotConnInfo) {
	if h.at != nil {
		h.at.GotConn(info)
	}
	if h.ct != nil && h.ct.GotConn != nil {
		h.ct.GotConn(info)
	}
}

func (h hooks) wroteHeaders() {
	if h.at != nil {
		h.at.WroteHeaders()
	}
	if h.ct != nil && h.ct.WroteHeaders != nil {
		h.ct.WroteHeaders()
	}
}

func (h hooks) wroteRequest(err error) {
	info := httptrace.WroteRequestInfo{Err: err}
	if h.at != nil {
		h.at.WroteRequest(info)
	}
	if h.ct != nil && h.ct.WroteRequest != nil {
		h.ct.WroteRequest(info)
	}
}

func (h hooks) firstByte() {
	if h.ct != nil && h.ct.GotFirstResponseByte != nil {
		h.ct.GotFirstResponseByte()
	}
}

// causeOf is err, or the cause of the exchange's end when it ended (its
// end interrupted the I/O that failed): the attempt's (a) when the runner
// runs it, else ctx's.
func causeOf(a *attempt.Ctx, ctx context.Context, err error) error {
	if a != nil {
		if c := a.Cause(); c != nil {
			return c
		}
		return err
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// ctxWatch is an exchange's registration of its connection's interrupt
// with its end: directly with the runner's attempt (a), else with ctx by
// context.AfterFunc.
type ctxWatch struct {
	ac   *attempt.Ctx
	stop func() bool
}

func watch(a *attempt.Ctx, ctx context.Context, interrupt func()) ctxWatch {
	if a != nil {
		a.SetHook(interrupt)
		return ctxWatch{ac: a}
	}
	return ctxWatch{stop: context.AfterFunc(ctx, interrupt)}
}

// release unregisters the interrupt, reporting whether the context was
// still running (false: the interrupt ran or is running).
func (w ctxWatch) release() bool {
	if w.ac != nil {
		return w.ac.ClearHook()
	}
	return w.stop()
}

// aLongTimeAgo is a deadline that has passed: it interrupts blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

// exchange writes req and reads the response head. On success the response
// body owns the connection: it returns it to the pool at its end.
func (c *h1Conn) exchange(ctx context.Context, req *http.Request, h hooks, order []string) (*http.Response, error) {
	w := watch(h.a, ctx, c.interrupt)
	fail := func(err error) (*http.Response, error) {
		w.release()
		c.close()
		return nil, causeOf(h.a, ctx, err)
	}

	body, cl, chunked, err := outgoingBody(req)
	if err != nil {
		return fail(err)
	}
	c.writeHead(req, order, cl, chunked)
	h.wroteHeaders()
	var wdone chan error
	var headRead atomic.Bool
	if body == nil || (!chunked && cl <= h1SyncBody && inMemory(body)) {
		// Head and body leave in one write(2).
		werr := c.writeBody(body, cl, false, false)
		if werr == nil {
			werr = c.bw.Flush()
		}
		h.wroteRequest(werr)
		if werr != nil {
			return fail(werr)
		}
	} else {
		// A body that streams from elsewhere, or a large one: the head
		// leaves now, the body as it comes, while the response is read
		// (the upstream may answer before it has read it all).
		if werr := c.bw.Flush(); werr != nil {
			h.wroteRequest(werr)
			return fail(werr)
		}
		wdone = make(chan error, 1)
		c.bodySent.Store(false)
		c.sourceDone.Store(false)
		c.writeState.Store(bodyWriting)
		go func() {
			werr := c.writeBody(body, cl, chunked, true)
			if werr == nil {
				werr = c.bw.Flush()
			}
			if werr == nil {
				c.bodySent.Store(true)
			}
			h.wroteRequest(werr)
			if werr != nil && !headRead.Load() {
				// The request cannot be completed: stop waiting for an
				// answer to it, and say why.
				c.writeErr.Store(&werr)
				c.nc.SetReadDeadline(aLongTimeAgo)
			}
			if !c.writeState.CompareAndSwap(bodyWriting, bodyWritten) {
				// The response ended first and left the connection to
				// this write (h1Body.end): it goes back to the pool
				// once its request has left whole.
				if werr == nil {
					c.nc.SetWriteDeadline(time.Time{})
					c.p.put(c)
				} else {
					c.close()
				}
			}
			wdone <- werr
		}()
	}

	resp, err := c.readHead(req, h)
	if err != nil {
		if we := c.writeErr.Load(); we != nil {
			err = *we // the read was stopped because the write failed
		}
		if wdone != nil {
			// Stop the body's write; the connection freezes for the
			// witness when it closes.
			c.nc.SetWriteDeadline(aLongTimeAgo)
		}
		return fail(err)
	}
	headRead.Store(true)
	if tc, ok := c.nc.(*tls.Conn); ok {
		st := tc.ConnectionState()
		resp.TLS = &st
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if err := switchAnswers(req, resp.Header); err != nil {
			return fail(err)
		}
		// The switch follows the whole request (RFC 9110 section 7.8): a
		// body still being written ends first, so that no byte of the new
		// protocol goes out among its bytes.
		if wdone != nil {
			if werr := <-wdone; werr != nil {
				return fail(werr)
			}
		}
		w.release()
		c.lr.n = -1
		resp.Body = c.upgraded()
		return resp, nil
	}
	resp.Body = &h1Body{c: c, rc: resp.Body, watch: w, a: h.a, ctx: ctx, wdone: wdone,
		keep: !resp.Close && !req.Close}
	return resp, nil
}

// outgoingBody tells how req's body goes on the wire: nil for none, else
// with its length, or chunked when the length is unknown.
func outgoingBody(req *http.Request) (body io.Reader, cl int64, chunked bool, err error) {
	if req.Body == nil || req.Body == http.NoBody || emptyBodyMarked(req) {
		return nil, 0, false, nil
	}
	switch {
	case req.ContentLength > 0:
		return req.Body, req.ContentLength, false, nil
	case req.ContentLength < 0:
		return req.Body, -1, true, nil
	}
	// A body with ContentLength 0: maybe empty, maybe of unknown length.
	var one [1]byte
	n, rerr := io.ReadFull(req.Body, one[:])
	if n == 0 {
		if rerr != nil && rerr != io.EOF {
			return nil, 0, false, rerr
		}
		return nil, 0, false, nil
	}
	return io.MultiReader(bytes.NewReader([]byte{one[0]}), req.Body), -1, true, nil
}

// sendsZeroLength: methods whose body-less requests say Content-Length: 0
// (as net/http's do).
func sendsZeroLength(method string) bool {
	return method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch
}

// validHeader refuses a request no upstream should see: a bad method, or a
// header field name (in its header or its field order) or value that is
// not valid HTTP.
func validHeader(req *http.Request, order []string) error {
	if req.Method != "" && !validMethod(req.Method) {
		return fmt.Errorf("%w: method %q", ErrRequestInvalid, req.Method)
	}
	for _, name := range order {
		if !httpguts.ValidHeaderFieldName(name) {
			return fmt.Errorf("%w: header field name %q", ErrRequestInvalid, name)
		}
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Errorf("%w: header field name %q", ErrRequestInvalid, k)
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Errorf("%w: value of header field %q", ErrRequestInvalid, k)
			}
		}
	}
	if host := requestHost(req); !httpguts.ValidHostHeader(host) {
		return fmt.Errorf("%w: host %q", ErrRequestInvalid, host)
	}
	return nil
}

// requestHost is the Host a request is sent with: Request.Host, else the
// URL's.
func requestHost(req *http.Request) string {
	if req.Host != "" {
		return req.Host
	}
	return req.URL.Host
}

func validMethod(m string) bool {
	for i := 0; i < len(m); i++ {
		if !httpguts.IsTokenRune(rune(m[i])) {
			return false
		}
	}
	return true
}

// skipHeader: fields written from the request's own fields, never from
// its header map.
var skipHeader = map[string]bool{"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Trailer": true}

// writeHead writes the request line and header fields (in order, see
// writeFields) to the connection's buffer.
func (c *h1Conn) writeHead(req *http.Request, order []string, cl int64, chunked bool) {
	bw := c.bw
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	bw.WriteString(method)
	bw.WriteByte(' ')
	uri := req.URL.RequestURI()
	if method == http.MethodConnect && req.URL.Path == "" {
		uri = req.URL.Host
	}
	bw.WriteString(uri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(requestHost(req))
	bw.WriteString("\r\n")
	writeFields(bw, req.Header, order)
	switch {
	case chunked:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	case cl > 0 || sendsZeroLength(method):
		var num [20]byte
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(num[:0], cl, 10))
		bw.WriteString("\r\n")
	}
	if req.Close && !httpguts.HeaderValuesContainsToken(req.Header["Connection"], "close") {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
}

// writeBody writes the body to the connection's buffer: exactly cl bytes,
// or chunked. stream flushes each piece as it is read (a body that comes
// from a client goes on as it comes); otherwise the buffer is flushed when
// it fills, and by the caller at the end.
func (c *h1Conn) writeBody(body io.Reader, cl int64, chunked, stream bool) error {
	if body == nil {
		return nil
	}
	if !chunked && !stream {
		n, err := io.CopyN(c.bw, body, cl)
		if err == io.EOF {
			return shortBody(n, cl)
		}
		if err != nil {
			return err
		}
		// Nothing has left yet: a body longer than its length is refused
		// before a byte goes out, not cut short in silence.
		return c.bodyEnds(body)
	}
	bp := chunkBufs.Get().(*[]byte)
	defer chunkBufs.Put(bp)
	var sent int64
	for {
		buf := *bp
		if !chunked {
			if sent == cl {
				return nil // bodyEnds ran before the last piece left
			}
			if int64(len(buf)) > cl-sent {
				buf = buf[:cl-sent]
			}
		}
		if stream {
			c.readingSource.Store(true)
		}
		n, err := body.Read(buf)
		if stream {
			c.readingSource.Store(false)
		}
		if n > 0 {
			sent += int64(n)
			if !chunked && sent == cl {
				// The last piece: the source is read to its end before
				// it leaves, so that its owner knows the body was read
				// whole by the time the upstream can answer (after it,
				// the owner could already be done with the exchange),
				// and an upstream never gets a whole request whose body
				// was longer than its length.
				if err := c.bodyEnds(body); err != nil {
					return err
				}
			}
			if chunked {
				h1.WriteChunk(c.bw, buf[:n])
			} else {
				c.bw.Write(buf[:n])
			}
			if stream {
				if werr := c.bw.Flush(); werr != nil {
					return werr
				}
			}
		}
		if err == io.EOF {
			c.sourceDone.Store(true)
		}
		switch {
		case err == io.EOF && chunked:
			return h1.EndChunks(c.bw)
		case err == io.EOF && sent < cl:
			return shortBody(sent, cl)
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
}

// shortBody is the error of a body that ended after n of its cl bytes.
func shortBody(n, cl int64) error {
	return fmt.Errorf("%w: request body ended after %d of its %d bytes", ErrRequestInvalid, n, cl)
}

// bodyEnds reads once more after a sized body's last byte, as net/http
// does: the source then sees its end (a proxy's client body knows it was
// read whole, so the client connection stays open), and a body longer than
// its Content-Length is refused rather than cut short in silence.
func (c *h1Conn) bodyEnds(body io.Reader) error {
	c.readingSource.Store(true)
	n, err := body.Read(c.one[:])
	c.readingSource.Store(false)
	switch {
	case n > 0:
		return fmt.Errorf("%w: request body longer than its Content-Length", ErrRequestInvalid)
	case err == io.EOF:
		c.sourceDone.Store(true)
		return nil
	case err == nil:
		return nil
	}
	return err
}

// inMemory reports whether reading body cannot wait on anything (a byte or
// string reader, a file): then a small one goes out with the head in one
// write. Readers that wrap them with io.NopCloser keep their WriteTo.
func inMemory(body io.Reader) bool {
	switch body.(type) {
	case *bytes.Reader, *strings.Reader, *bytes.Buffer, *os.File:
		return true
	}
	if k, ok := body.(interface{ BodyKind() engine.Body }); ok {
		return k.BodyKind() == engine.BodyReplayable || k.BodyKind() == engine.BodyReopenable
	}
	_, ok := body.(io.WriterTo)
	return ok
}

var chunkBufs = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// readHead reads the response head, passing over 1xx responses other than
// 101.
func (c *h1Conn) readHead(req *http.Request, h hooks) (*http.Response, error) {
	limit := int64(c.p.t.opts.MaxResponseHeaderBytes)
	if limit <= 0 {
		limit = defaultMaxResponseHeaderBytes
	}
	first := true
	for {
		// The limit counts what is read from the socket from here on; bytes
		// already buffered were read under an earlier head's.
		c.lr.n = limit
		if _, err := c.br.Peek(1); err != nil {
			c.lr.n = -1
			if first && err == io.EOF && !c.tls && h.at != nil {
				h.at.PeerEnded()
			}
			return nil, err
		}
		if first {
			h.firstByte()
		}
		first = false
		resp, err := readResponse(c.br, req, &c.scratch)
		c.lr.n = -1
		if err != nil {
			return nil, fmt.Errorf("reading the response head: %w", err)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		return resp, nil
	}
}

// h1Body is a response body on an h1Conn: at its end the connection goes
// back to the pool (if the exchange allows another), on an error or an
// early Close it is closed.
type h1Body struct {
	c     *h1Conn
	rc    io.ReadCloser
	watch ctxWatch
	a     *attempt.Ctx    // the runner's attempt, nil when none
	ctx   context.Context // the exchange's: its cause explains an interrupted read
	wdone chan error      // the body's write, when it ran beside the read
	keep  bool
	ended atomic.Bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.ended.Load() {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.end(true)
	case err != nil:
		err = causeOf(b.a, b.ctx, err)
		b.end(false)
	}
	return n, err
}

// Close ends the exchange; a body not read to its end costs the
// connection. It may run while another goroutine reads (to abort it).
func (b *h1Body) Close() error {
	b.end(false)
	return nil
}

func (b *h1Body) end(clean bool) {
	if b.ended.Swap(true) {
		return
	}
	// A context that fired (or is firing) may have set a deadline on the
	// connection: it cannot be reused then.
	reuse := b.watch.release() && clean && b.keep
	if b.wdone != nil {
		switch {
		case b.c.bodySent.Load():
			// Written whole: its goroutine is only reporting.
			reuse = reuse && <-b.wdone == nil
		case b.c.sourceDone.Load() && reuse && b.c.br.Buffered() == 0:
			// Inside the last write (on loopback the upstream can read
			// the last piece and answer before the write call returns):
			// its end is the event that frees the connection, and it may
			// be slow (a full socket buffer), so the write puts the
			// connection back itself, rather than the response's end
			// waiting on it.
			if b.handOff() {
				return
			}
			reuse = <-b.wdone == nil && b.c.bodySent.Load()
		default:
			// The upstream answered before it had the whole body, which
			// still comes from its source: the connection cannot carry
			// another request. Closing it ends the write at its next
			// piece.
			reuse = false
		}
	}
	if reuse && b.c.br.Buffered() == 0 {
		b.c.p.put(b.c)
		return
	}
	b.c.close()
}

// handOff leaves the connection to the body's write still in flight, which
// returns it to the pool when it has written the request's last bytes (or
// closes it if it fails): nobody waits on it. The write gets the idle
// timeout to end in (a connection that cannot take the rest of its request
// in that time would have expired idle anyway). It reports false when the
// write ended meanwhile: the caller then has its result in wdone.
func (b *h1Body) handOff() bool {
	c := b.c
	// The deadline is set before the hand-off, so that it is never set on
	// a connection the write has already put back in the pool.
	c.nc.SetWriteDeadline(time.Now().Add(c.p.t.opts.IdleConnTimeout))
	if c.writeState.CompareAndSwap(bodyWriting, bodyHandedOff) {
		return true
	}
	c.nc.SetWriteDeadline(time.Time{})
	return false
}

// errBadSwitch: a 101 that answers no request to switch, or switches to
// what the request did not offer.
var errBadSwitch = fmt.Errorf("%w: 101 Switching Protocols", errMalformedResponse)

// switchAnswers says why a 101 response with header h is no answer to req,
// or nil. A 101 answers only an HTTP/1.1 request that asked to switch
// (Upgrade, and Connection naming it), says what it switches to (Upgrade,
// Connection: upgrade) and switches only to protocols the request offered
// (RFC 9110 section 7.8; names compared without case, as section 16.7
// asks). Anything else is a malformed response: the connection is no
// longer HTTP, and its bytes must not reach a client as if it were.
func switchAnswers(req *http.Request, h http.Header) error {
	if !AsksUpgrade(req) {
		return fmt.Errorf("%w to a request that asked for no upgrade", errBadSwitch)
	}
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "upgrade") || len(h["Upgrade"]) == 0 {
		return fmt.Errorf("%w without Upgrade and Connection: upgrade", errBadSwitch)
	}
	for _, v := range h["Upgrade"] {
		for p := range strings.SplitSeq(v, ",") {
			p = textproto.TrimString(p)
			if p == "" || !offered(req.Header["Upgrade"], p) {
				return fmt.Errorf("%w to %q, which the request did not offer", errBadSwitch, p)
			}
		}
	}
	return nil
}

// AsksUpgrade reports whether req asks to switch protocols: an HTTP/1.1
// request (an HTTP/1.0 request's Upgrade is ignored, RFC 9110 section 7.8)
// with an Upgrade field that a Connection field names.
func AsksUpgrade(req *http.Request) bool {
	return req.ProtoAtLeast(1, 1) && len(req.Header["Upgrade"]) > 0 &&
		httpguts.HeaderValuesContainsToken(req.Header["Connection"], "upgrade")
}

// offered reports whether the protocol p (name[/version]) is among those
// the Upgrade values list: the same name, and the same version when both
// give one.
func offered(list []string, p string) bool {
	name, ver, _ := strings.Cut(p, "/")
	for _, v := range list {
		for o := range strings.SplitSeq(v, ",") {
			oname, over, _ := strings.Cut(textproto.TrimString(o), "/")
			if strings.EqualFold(oname, name) && (ver == "" || over == "" || strings.EqualFold(over, ver)) {
				return true
			}
		}
	}
	return false
}

// upgraded returns the body of a 101 response: the connection, no longer
// watched for the witness (the attempt is over; a frozen attempt.Conn
// would refuse writes after the upstream's half-close, and reset bytes
// still queued when it closes). A plain connection is used without its
// wrapper, so that it can half-close.
func (c *h1Conn) upgraded() *h1Upgraded {
	nc := c.nc
	if c.wc != nil {
		c.wc.HandOver()
		if nc == net.Conn(c.wc) {
			nc = c.wc.NetConn()
			c.lr.c = nc
		}
	}
	return &h1Upgraded{Conn: nc, c: c}
}

// h1Upgraded is the body of a 101 response: the connection itself, as a
// net.Conn whose reads first return what came after the response head.
type h1Upgraded struct {
	net.Conn
	c *h1Conn
}

func (u *h1Upgraded) Read(p []byte) (int, error) { return u.c.br.Read(p) }
func (u *h1Upgraded) Close() error               { u.c.close(); return nil }

// CloseWrite half-closes the connection's sending side (TLS: sends its
// close_notify), where the connection can.
func (u *h1Upgraded) CloseWrite() error {
	if cw, ok := u.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

var (
	_ io.ReadCloser = (*h1Body)(nil)
	_ net.Conn      = (*h1Upgraded)(nil)
)

// writeFields writes the fields of h but those of skipHeader: first as
// order names them (the field names as the client sent them, one per
// field line: in that order, with those names), then the rest (added by
// the proxy, or values added to a field) by canonical name, values in
// order. The n-th line naming a field (in any case) carries its n-th
// value; a field no longer in h is left out.
func writeFields(bw *bufio.Writer, h http.Header, order []string) {
	for i, name := range order {
		key := textproto.CanonicalMIMEHeaderKey(name)
		if skipHeader[key] {
			continue
		}
		vv := h[key]
		n := 0 // lines naming key before this one
		for _, prev := range order[:i] {
			if strings.EqualFold(prev, name) {
				n++
			}
		}
		if n >= len(vv) {
			continue
		}
		writeField(bw, name, vv[n])
	}
	// What the order does not cover, by canonical name.
	var buf [16]string
	rest := buf[:0]
	for k, vv := range h {
		if !skipHeader[k] && len(vv) > sentCount(order, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		for _, v := range h[k][sentCount(order, k):] {
			writeField(bw, k, v)
		}
	}
}

// sentCount is how many lines of order name the field key (canonical).
func sentCount(order []string, key string) int {
	n := 0
	for _, name := range order {
		if strings.EqualFold(name, key) {
			n++
		}
	}
	return n
}

func writeField(bw *bufio.Writer, name, value string) {
	bw.WriteString(name)
	bw.WriteString(": ")
	bw.WriteString(value)
	bw.WriteString("\r\n")
}
