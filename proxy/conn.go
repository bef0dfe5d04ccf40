package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/rawsock"
)

// Why a custom connection loop rather than net/http.Server: the proxy must
// own the raw connection. In transparent mode it sniffs the first bytes and
// hands non-HTTP connections over byte for byte; it must refuse
// Content-Length with Transfer-Encoding (net/http quietly drops the
// Content-Length), count header fields (net/http only bounds their size),
// and abort the client connection when a relayed body breaks (net/http
// would end a chunked body cleanly). So each connection is served here, and
// a head read with limits is parsed by parseHead.

type connState uint8

const (
	stateIdle   connState = iota // waiting for a next request on a kept connection
	stateNew                     // accepted, its first request not begun
	stateActive                  // reading, forwarding or answering one
	stateTunnel                  // CONNECT tunnel or passthrough
	stateH2                      // an HTTP/2 connection, served by its own net/http server (h2)
)

// conn is one client connection.
type conn struct {
	s     *Server
	c     net.Conn
	br    *bufio.Reader
	bw    *bufio.Writer
	state connState // guarded by s.mu
	dst   netip.AddrPort
	// dstAddr is dst as host:port, dstHost its address alone (transparent
	// mode), made once per connection.
	dstAddr, dstHost string
	pr               prefixReader
	// linger: the proxy ends the connection after a request, with input
	// perhaps still coming (a refused request's body, the rest of a
	// one-shot body); aborted: it was reset on purpose.
	linger, aborted bool
	// bodyBegun: a relayed response body has begun going to the client
	// (read by Shutdown's cut: such a response can only be reset).
	bodyBegun atomic.Bool
	// idleUntil is the end of the current wait for a next request (zero
	// while none is waited for); served counts the requests begun.
	idleUntil time.Time
	served    int
	pk        parkState // while parked (park_linux.go)
	// upgradedTo is the upstream connection a request switched protocols
	// on (switched): the loop pipes the client to it once the request's
	// hold on the pod's limits is given back.
	upgradedTo io.ReadWriteCloser
	// h2 is the connection's HTTP/2 server, once its client spoke the
	// HTTP/2 preface (serveH2).
	h2 *h2conn
}

// Lingering close: how long and how much of the client's remaining input
// is read and dropped after the proxy half-closes, so that the client reads
// the answer before any reset (RFC 9112 section 9.6).
const (
	lingerTimeout = 500 * time.Millisecond
	lingerMax     = 4 << 20
)

// lingeringClose half-closes the connection and drains what the client
// still sends, until it closes, lingerTimeout or lingerMax. Closing with
// unread input would make the kernel send a reset, which can destroy the
// answer before the client has read it.
func (c *conn) lingeringClose() {
	cw, ok := c.c.(closeWriter)
	if !ok || cw.CloseWrite() != nil {
		return
	}
	c.c.SetReadDeadline(time.Now().Add(lingerTimeout))
	io.CopyN(io.Discard, c.c, lingerMax)
}

// waitRequest waits for the next request's first bytes, until the read
// deadline set; timedOut says that the deadline ended the wait. With
// nothing buffered, the connection gives its reader back to the pool while
// it waits, so that an idle keep-alive connection holds no buffer.
func (c *conn) waitRequest() (ok, timedOut bool) {
	if c.br != nil && (c.br.Buffered() > 0 || c.pr.pending()) {
		return true, false
	}
	c.releaseReader()
	if ok, timedOut = c.pr.wait(); !ok {
		return false, timedOut
	}
	c.br = readerPool.Get().(*bufio.Reader)
	c.br.Reset(&c.pr)
	return true, false
}

func (c *conn) releaseReader() {
	if c.br != nil {
		c.br.Reset(nil)
		readerPool.Put(c.br)
		c.br = nil
	}
}

// prefixReader reads what wait read, then the connection.
type prefixReader struct {
	c      net.Conn
	rc     syscall.RawConn // nil: c is not a socket (a test's pipe)
	buf    *[]byte         // pooled, holding buf[off:n] not yet read
	off, n int
	// readFn is r.readFD, made once: a closure per wait would escape.
	readFn func(fd uintptr) bool
	rn     int
	rerr   error
	// headDeadline, when set, is the read deadline of the request head,
	// set on the connection only when the head is not all in hand and
	// Read must wait for the rest: most heads arrive whole.
	headDeadline time.Time
	// cut is the server's: set, the head's read ends at once.
	cut *atomic.Bool
}

func (r *prefixReader) init(c net.Conn) {
	r.c = c
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			r.rc, r.readFn = rc, r.readFD
		}
	}
}

func (r *prefixReader) pending() bool { return r.off < r.n }

// wait blocks until the connection has bytes (or ends, or its read
// deadline passes: timedOut) and reads what is there. On a socket it reads
// straight into a pooled buffer when the kernel has data, and holds no
// buffer while it waits for readiness: one read(2) for a request that is
// already there, where a one-byte read and a buffered read took two (three
// for a 4 KiB POST).
func (r *prefixReader) wait() (ok, timedOut bool) {
	if r.rc == nil {
		r.take()
		n, err := r.c.Read((*r.buf)[:1])
		if n == 0 || err != nil && n == 0 {
			r.release()
			return false, false
		}
		r.off, r.n = 0, n
		return true, false
	}
	var err error
	if r.cut != nil && r.cut.Load() {
		// Shutdown's grace is over (checked after the caller set its
		// deadline; the cut's deadline in the past would keep even a
		// request already here from being read): what has arrived is
		// taken, to be answered, and nothing is waited for.
		ok := false
		if err = r.rc.Control(func(fd uintptr) { ok = r.readFn(fd) }); err == nil && !ok {
			return false, false
		}
	} else {
		err = r.rc.Read(r.readFn)
	}
	n, rerr := r.rn, r.rerr
	r.rerr = nil
	if err != nil || rerr != nil || n <= 0 {
		r.release()
		return false, err != nil && errors.Is(err, os.ErrDeadlineExceeded)
	}
	r.off, r.n = 0, n
	return true, false
}

// readFD is wait's read on the socket: false (wait for readiness, holding
// no buffer) when the kernel has nothing yet.
func (r *prefixReader) readFD(fd uintptr) bool {
	r.take()
	r.rn, r.rerr = rawsock.Read(fd, *r.buf) // EINTR is retried there
	if r.rerr == syscall.EAGAIN {
		r.release()
		return false
	}
	return true
}

func (r *prefixReader) take() {
	if r.buf == nil {
		r.buf = prefixBufs.Get().(*[]byte)
	}
}

// release gives the buffer back to the pool; what it held is dropped.
func (r *prefixReader) release() {
	if r.buf != nil {
		prefixBufs.Put(r.buf)
		r.buf = nil
	}
	r.off, r.n = 0, 0
}

func (r *prefixReader) Read(p []byte) (int, error) {
	if r.off < r.n {
		k := copy(p, (*r.buf)[r.off:r.n])
		r.off += k
		if r.off == r.n {
			r.release()
		}
		return k, nil
	}
	if !r.headDeadline.IsZero() {
		r.c.SetReadDeadline(r.headDeadline)
		r.headDeadline = time.Time{}
		// After the deadline is set, as a body's reads do (spool.Source).
		if r.cut != nil && r.cut.Load() {
			r.c.SetReadDeadline(aLongTimeAgo)
		}
	}
	return r.c.Read(p)
}

var (
	readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}
	writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4096) }}
	headBufs   = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}
	prefixBufs = sync.Pool{New: func() any { b := make([]byte, 8192); return &b }}
)

// serve serves a new connection. It returns when the connection has ended
// or was parked (idle, handed to the parker, which resumes or ends it).
func (c *conn) serve() {
	if c.begin() && c.loop() {
		return // parked
	}
	c.end()
}

// resume continues a parked connection's request loop in a goroutine of
// its own, started by the parker (its socket is readable, or its peer
// went) or by Shutdown (which closed it).
func (c *conn) resume() {
	if c.loop() {
		return // parked again
	}
	c.end()
}

// end releases what the connection holds, closes it and removes it from
// the server: its connection slot and descriptors are given back.
func (c *conn) end() {
	c.releaseReader()
	c.pr.release()
	if c.linger && !c.aborted {
		c.lingeringClose()
	}
	c.c.Close()
	c.s.removeConn(c)
}

// begin prepares a new connection and, in transparent mode, sniffs it; it
// reports whether the connection goes on to the HTTP request loop.
func (c *conn) begin() bool {
	c.pr.init(c.c)
	c.pr.cut = &c.s.cut
	c.br = readerPool.Get().(*bufio.Reader)
	c.br.Reset(&c.pr)
	log := c.s.cfg.Logger
	if c.s.cfg.Mode == Transparent {
		dst, err := c.s.cfg.Resolver.OriginalDst(c.c)
		if err != nil {
			log.Warn("original destination", "client", c.c.RemoteAddr().String(), "err", err)
			return false
		}
		dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
		if c.s.loops(dst) {
			log.Warn("original destination is egret's own listener: a loop", "client", c.c.RemoteAddr().String(), "dst", dst.String())
			return false
		}
		c.dst, c.dstAddr, c.dstHost = dst, dst.String(), dst.Addr().String()
		proto, err := sniff(c.c, c.br, c.s.cfg.SniffTimeout)
		if err != nil || proto != ProtoHTTP1 && c.s.cut.Load() {
			// Gone, or Shutdown's grace is over and this is no request
			// it could answer: the connection ends.
			return false
		}
		if proto == ProtoSilent {
			if proto = c.silent(); proto == "" {
				return false // passed through, or gone
			}
		}
		if proto == ProtoHTTP2 {
			// HTTP/2 with prior knowledge: served (h2.go), never learned
			// as a destination to pass through.
			c.serveH2()
			return false
		}
		if proto != ProtoHTTP1 {
			c.learn(proto)
			c.passthrough(proto, c.dstAddr, nil)
			return false
		}
	}
	return true
}

// maxRequestsPerConn bounds the loop; a client reconnects after it.
const maxRequestsPerConn = 1 << 20

// loop serves requests until the connection ends (false) or is parked
// (true: the parker owns c now, and its caller must not touch it).
func (c *conn) loop() (parked bool) {
	for c.served < maxRequestsPerConn {
		switch c.waitNext() {
		case waitParked:
			return true
		case waitEnded:
			return false
		}
		c.served++
		if !c.next() {
			return false
		}
	}
	return false
}

type waitResult uint8

const (
	waitReady  waitResult = iota // a request's first bytes are here
	waitEnded                    // gone, closed, or idle for IdleTimeout
	waitParked                   // idle for ParkAfter: handed to the parker
)

// waitNext waits for the next request's first bytes, up to IdleTimeout
// from the end of the last request (or from the connection's start). When
// the server parks idle connections it waits only ParkAfter with its
// goroutine, and then parks the connection for the rest of its idle time.
// A busy connection does not pay for it: the read deadline it sets per
// request is the nearer of the two ends, one time.Now as before.
func (c *conn) waitNext() waitResult {
	now := time.Now()
	if c.idleUntil.IsZero() {
		c.idleUntil = now.Add(c.s.cfg.IdleTimeout)
	}
	deadline, park := c.idleUntil, false
	if pa := c.s.parkAfter; pa > 0 && c.pr.rc != nil {
		if p := now.Add(pa); p.Before(deadline) {
			deadline, park = p, true
		}
	}
	for {
		c.c.SetReadDeadline(deadline)
		ok, timedOut := c.waitRequest()
		if ok {
			c.idleUntil = time.Time{}
			return waitReady
		}
		if !park || !timedOut {
			return waitEnded
		}
		if c.s.park.park(c) {
			return waitParked
		}
		// Not parked (closed meanwhile): the wait goes on with the
		// goroutine, as without a parker.
		deadline, park = c.idleUntil, false
	}
}

// next serves one request, whose first bytes are here, and reports whether
// the connection stays open.
func (c *conn) next() bool {
	cfg := &c.s.cfg
	if !c.s.setState(c, stateActive) {
		return false
	}
	defer c.s.setState(c, stateIdle)
	c.linger = true // until the request is served and the connection kept

	// The writer and the head buffer are held only while a request is
	// served: an idle keep-alive connection keeps just its reader.
	c.bw = writerPool.Get().(*bufio.Writer)
	c.bw.Reset(c.c)
	hb := headBufs.Get().(*[]byte)
	defer func() {
		c.bw.Reset(nil)
		writerPool.Put(c.bw)
		c.bw = nil
		if cap(*hb) <= 8<<10 {
			headBufs.Put(hb)
		}
	}()
	// The read deadline in force stays the idle one (or the head's, when
	// the head had to be waited for) until a read that needs another:
	// a body's reads set their own, a tunnel clears it.
	start := time.Now()
	c.pr.headDeadline = start.Add(cfg.ReadHeaderTimeout)
	head, err := readHead(c.br, (*hb)[:0], headLimits{maxBytes: cfg.MaxHeaderBytes, maxCount: cfg.MaxHeaderCount})
	c.pr.headDeadline = time.Time{}
	*hb = head[:0]
	if err != nil {
		if c.s.cut.Load() && !errors.Is(err, io.EOF) {
			c.shutdownAnswer(c, nil, newRequestID(), start, "egret shut down while the request head was being read")
			return false
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.refuse(c, nil, newRequestID(), start, http.StatusRequestTimeout, "request header not received in time")
			return false
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
			return false
		}
		c.refuse(c, nil, newRequestID(), start, statusOf(err), err.Error())
		return false
	}
	req, order, err := parseHead(head)
	if err != nil {
		c.refuse(c, nil, newRequestID(), start, statusOf(err), err.Error())
		return false
	}
	if c.s.cut.Load() {
		// A request that arrived as Shutdown's grace ended: none of it
		// went anywhere.
		c.shutdownAnswer(c, req, newRequestID(), start, "egret shut down as the request came")
		return false
	}
	keep := c.handle(req, order, head, start)
	c.linger = !keep
	if up := c.upgradedTo; up != nil {
		c.upgradedTo = nil
		c.linger = false
		c.pipeUpgraded(up)
	}
	return keep
}

// pipeUpgraded copies bytes both ways between the client and the upstream
// connection its request switched protocols on, the client's bytes that
// followed the request first. In explicit mode it is closed, as a CONNECT
// tunnel is, when silent both ways for TunnelIdleTimeout.
func (c *conn) pipeUpgraded(up io.ReadWriteCloser) {
	c.c.SetWriteDeadline(time.Time{})
	c.c.SetReadDeadline(time.Time{})
	var a, b io.ReadWriteCloser = &bufferedConn{Conn: c.c, r: c.br}, up
	if d, ok := up.(deadlineRW); ok && c.s.cfg.Mode == Explicit {
		idle := newIdleClock(c.s.cfg.TunnelIdleTimeout)
		a, b = idle.wrap(&bufferedConn{Conn: c.c, r: c.br}), idle.wrap(d)
	}
	aToB, bToA := pipe(a, b, nil)
	c.s.cfg.Logger.Debug("passthrough", "protocol", string(ProtoUpgrade), "sent", aToB, "received", bToA)
}

// refuse answers a request the proxy will not forward. The connection is
// closed afterwards when req is nil (the stream cannot be trusted) or the
// request asked for it.
func (c *conn) refuse(w answerer, req *http.Request, id string, start time.Time, status int, msg string) {
	c.s.cfg.Metrics.request(labelRejected)
	w.answer(req, &answer{id: id, status: status, msg: msg, close: true})
	l := requestLog{id: id, outcome: labelRejected, status: status, start: start, err: msg}
	if req != nil {
		l.method, l.u = req.Method, req.URL
	}
	c.logRequest(l)
}

// answer is a response the proxy makes itself.
type answer struct {
	id       string
	status   int
	outcome  string // Egret-Outcome, "" for none
	attempts int
	msg      string
	close    bool
	extra    http.Header
}

// fields sets in h the header fields of an answer egret makes itself,
// whatever its protocol: a's extra ones, then egret's own.
func (a *answer) fields(h http.Header) {
	for k, v := range a.extra {
		h[k] = v
	}
	h.Set(HeaderRequestID, a.id)
	h.Set(HeaderAttempts, strconv.Itoa(a.attempts))
	if a.outcome != "" {
		h.Set(HeaderOutcome, a.outcome)
	}
}

// answer writes a's response. It reports whether it was written.
func (c *conn) answer(req *http.Request, a *answer) bool {
	body := answerText(a.msg)
	if body != "" {
		body += "\n"
	}
	h := http.Header{}
	a.fields(h)
	h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if a.close {
		h.Set("Connection", "close")
	}
	c.c.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	fmt.Fprintf(c.bw, "HTTP/1.1 %d %s\r\n", a.status, http.StatusText(a.status))
	h.Write(c.bw)
	c.bw.WriteString("\r\n")
	if req == nil || req.Method != http.MethodHead {
		c.bw.WriteString(body)
	}
	return c.bw.Flush() == nil
}

// abort ends the client connection with a reset, so that the client cannot
// take a cut response for a complete one.
func (c *conn) abort() {
	c.aborted = true
	closeWithReset(c.c)
}

// closeWithReset closes nc with a reset (SO_LINGER 0) rather than a clean end.
func closeWithReset(nc net.Conn) {
	if l, ok := nc.(interface{ SetLinger(int) error }); ok {
		l.SetLinger(0)
	}
	nc.Close()
}

// passthrough connects the client to its original destination and copies
// bytes both ways, unchanged. prefix is sent first (a request head already
// consumed from the buffer). The flow's outcome is counted under its
// destination: for TLS, the server name of the ClientHello (passflow.go).
func (c *conn) passthrough(proto Protocol, addr string, prefix []byte) {
	c.s.cfg.Metrics.passedThrough(proto)
	c.s.setState(c, stateTunnel)
	sni := ""
	if proto == ProtoTLS && c.s.cfg.Metrics != nil {
		sni = clientHelloSNI(c.c, c.br)
	}
	dest, named := c.flowDest(sni)
	if up := c.dialPassthrough(proto, addr, dest, named); up != nil {
		up.commit(c.s.cfg.Source, proto, dest, named)
		c.pipeThrough(proto, addr, up, prefix, nil)
	}
}

// dialPassthrough dials addr for a passthrough; when that fails it logs,
// counts the flow's failure under proto and dest (named: by the policy),
// resets the client and returns nil. The connection it returns counts
// nothing until committed.
func (c *conn) dialPassthrough(proto Protocol, addr, dest string, named bool) *flowConn {
	ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.DialTimeout)
	up, err := c.s.cfg.Dial(ctx, "tcp", addr)
	cancel()
	if err != nil && c.s.cut.Load() && c.br.Buffered() == 0 {
		// Shutdown's cut cancelled the dial of a connection whose client
		// has said nothing egret read: nothing to answer or pass on, so
		// it just ends (the kernel still resets it if bytes came since).
		return nil
	}
	if err != nil {
		// The pod's connect succeeded (to egret) and the destination
		// cannot be reached: the closest a proxy that already accepted
		// can come to the kernel's answer is a reset at once (SO_LINGER
		// 0), before the pod's next read or write; see agent/README.md
		// for what the pod sees.
		reason := dialFailure(err)
		c.s.cfg.Metrics.passthroughDialFailed(proto, reason)
		c.s.cfg.Metrics.passthroughDialFlow(c.s.cfg.Source, proto, dest, named, err)
		c.s.cfg.Logger.Warn("passthrough dial failed; the pod's connection is reset",
			"protocol", string(proto), "dst", addr, "client", c.c.RemoteAddr().String(),
			"reason", reason, "err", err)
		c.abort()
		return nil
	}
	return newFlowConn(up, c.s.cfg.Metrics, c.s.cfg.Witness)
}

// dialFailure names why a dial failed, for the metric's reason label.
func dialFailure(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		return "timeout"
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return "unreachable"
	}
	return "other"
}

// learn tells the Learner that this connection's destination is one egret
// passes through, unless the policy may originate TLS for it (the pod's
// plain HTTP to it must keep coming to egret): an entry that originates
// TLS names its address, covers it by wildcard, or names a host egret's
// resolver maps to it.
func (c *conn) learn(proto Protocol) {
	cfg := &c.s.cfg
	if cfg.Learner == nil || !Learnable(proto) || !c.dst.IsValid() {
		return
	}
	o := cfg.Policy.Current().TLSOriginFor(c.dst)
	if o.Always {
		return
	}
	for _, h := range o.Names {
		if cfg.Names.Resolves(context.Background(), h, c.dst.Addr()) {
			return
		}
	}
	if err := cfg.Learner.LearnDirect(c.dst, proto); err != nil {
		cfg.Logger.Warn("learn direct", "dst", c.dstAddr, "protocol", string(proto), "err", err)
		return
	}
	cfg.Metrics.learnedDirect(proto)
}

// pipeThrough copies bytes both ways between the client and up until both
// are done: first prefix to up, and toClient (what up said already) to the
// client.
func (c *conn) pipeThrough(proto Protocol, addr string, up net.Conn, prefix, toClient []byte) {
	if len(toClient) > 0 {
		if _, err := c.c.Write(toClient); err != nil {
			up.Close()
			return
		}
	}
	c.c.SetReadDeadline(time.Time{})
	aToB, bToA := pipe(&bufferedConn{Conn: c.c, r: c.br}, up, prefix)
	c.s.cfg.Logger.Debug("passthrough", "protocol", string(proto), "dst", addr,
		"sent", aToB, "received", bToA+int64(len(toClient)))
}

// aLongTimeAgo is a deadline in the past: it ends a blocked read at once.
var aLongTimeAgo = time.Unix(1, 0)

// silent serves a transparent connection whose client said nothing within
// the sniff timeout: either a protocol in which the server speaks first
// (SMTP, MySQL, SSH on ports not excluded) or a client that connects ahead
// of its first request (a pool warming up). It dials the destination and
// waits for whichever side speaks first, up to the idle timeout:
//   - the destination: passed through (server_first), its bytes first;
//   - the client: its bytes are sniffed as usual. An HTTP/1.x request while
//     the destination has said nothing is served as HTTP (the connection
//     just dialed is closed unused: no byte of anyone's went on it) and
//     silent returns ProtoHTTP1; any other protocol is passed through under
//     its own name.
//
// It returns "" once the connection was passed through or ended.
func (c *conn) silent() Protocol {
	cfg := &c.s.cfg
	dest, named := c.flowDest("")
	up := c.dialPassthrough(ProtoSilent, c.dstAddr, dest, named)
	if up == nil {
		cfg.Metrics.passedThrough(ProtoSilent)
		return ""
	}
	type heard struct {
		proto Protocol
		b     []byte
		err   error
	}
	fromClient, fromUp := make(chan heard, 1), make(chan heard, 1)
	c.c.SetReadDeadline(time.Now().Add(cfg.IdleTimeout))
	if c.s.cut.Load() {
		// The cut (which sets cut before it sets its deadline) may have
		// come between the dial and the line above: its deadline in the
		// past holds.
		c.c.SetReadDeadline(aLongTimeAgo)
	}
	go func() {
		p, err := sniffBuffered(c.br)
		fromClient <- heard{proto: p, err: err}
	}()
	go func() {
		b := make([]byte, 4096)
		n, err := up.Read(b)
		fromUp <- heard{b: b[:n], err: err}
	}()
	// The side that did not speak is interrupted, and its read waited for:
	// whatever it got meanwhile is kept.
	var cl, ul heard
	select {
	case cl = <-fromClient:
		up.SetReadDeadline(aLongTimeAgo)
		ul = <-fromUp
		up.SetReadDeadline(time.Time{})
	case ul = <-fromUp:
		c.c.SetReadDeadline(aLongTimeAgo)
		cl = <-fromClient
	}
	c.c.SetReadDeadline(time.Time{})
	if cl.err == nil && (cl.proto == ProtoHTTP1 || cl.proto == ProtoHTTP2) && len(ul.b) == 0 {
		up.Close()
		cfg.Metrics.lateHTTP()
		return cl.proto
	}
	if cl.err != nil && !errors.Is(cl.err, os.ErrDeadlineExceeded) && c.br.Buffered() == 0 || c.s.cut.Load() {
		// The client left (or Shutdown closed it) before a word, or
		// Shutdown's grace ended (its deadline in the past ended the
		// wait) with no request to answer.
		up.Close()
		return ""
	}
	proto := ProtoSilent
	if cl.err == nil && len(ul.b) == 0 {
		proto = cl.proto // the client spoke first, not HTTP/1.x
	}
	if len(ul.b) > 0 || proto != ProtoSilent {
		// The destination spoke first, or the client spoke something
		// else than HTTP/1.x: either way not one egret can act on.
		c.learn(proto)
	}
	cfg.Metrics.passedThrough(proto)
	c.s.setState(c, stateTunnel)
	if proto == ProtoTLS && cfg.Metrics != nil {
		dest, named = c.flowDest(clientHelloSNI(c.c, c.br))
	}
	up.commit(cfg.Source, proto, dest, named)
	if ul.err != nil && len(ul.b) == 0 && isReset(ul.err) {
		// The destination reset the connection before anyone spoke
		// (counted at commit): the pod's connection is reset too.
		up.Close()
		c.abort()
		return ""
	}
	c.pipeThrough(proto, c.dstAddr, up, nil, ul.b)
	return ""
}

// tunnel serves an explicit-mode CONNECT: it dials the target, says 200
// and copies bytes both ways, without retries (there is no request to see).
// Only the ports of Config.ConnectPorts are reached, never a denied or
// egret's own address (403), and a tunnel silent both ways for
// TunnelIdleTimeout is closed.
func (c *conn) tunnel(req *http.Request, id string, start time.Time) {
	target := req.RequestURI
	host, port, err := net.SplitHostPort(target)
	if err != nil || host == "" || port == "" {
		c.refuse(c, req, id, start, http.StatusBadRequest, "CONNECT needs host:port")
		return
	}
	if err := c.s.connectAllowed(port); err != nil {
		c.refuse(c, req, id, start, http.StatusForbidden, err.Error())
		return
	}
	n, _ := strconv.Atoi(port)
	if err := c.s.checkTarget(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), n); err != nil {
		c.refuse(c, req, id, start, http.StatusForbidden, err.Error())
		return
	}
	c.s.cfg.Metrics.tunnel()
	c.s.setState(c, stateTunnel)
	ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.DialTimeout)
	up, err := c.s.cfg.Dial(ctx, "tcp", target)
	cancel()
	if errors.Is(err, ErrDestinationDenied) {
		c.refuse(c, req, id, start, http.StatusForbidden, err.Error())
		return
	}
	if err != nil {
		notSent := engine.OutcomeNotSent.String()
		c.s.cfg.Metrics.request(notSent)
		c.answer(req, &answer{id: id, status: http.StatusServiceUnavailable, outcome: notSent,
			attempts: 1, msg: "CONNECT " + target + ": " + err.Error(), close: true})
		c.logRequest(requestLog{id: id, method: req.Method, url: target, attempts: 1, outcome: notSent,
			status: http.StatusServiceUnavailable, start: start, err: err.Error()})
		return
	}
	c.s.cfg.Metrics.request(labelRelayed)
	c.c.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	fmt.Fprintf(c.bw, "HTTP/1.1 200 Connection established\r\n%s: %s\r\n%s: 1\r\n\r\n",
		HeaderRequestID, id, HeaderAttempts)
	if err := c.bw.Flush(); err != nil {
		up.Close()
		return
	}
	c.c.SetWriteDeadline(time.Time{})
	c.c.SetReadDeadline(time.Time{})
	c.logRequest(requestLog{id: id, method: req.Method, url: target, attempts: 1, outcome: "tunnel",
		status: http.StatusOK, start: start})
	idle := newIdleClock(c.s.cfg.TunnelIdleTimeout)
	pipe(idle.wrap(&bufferedConn{Conn: c.c, r: c.br}), idle.wrap(up), nil)
}
