package proxy

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/egret-proxy/egret/retry"
)

// The pod side of HTTP/2: a transparent connection whose client speaks
// first the HTTP/2 connection preface (h2c with prior knowledge, as gRPC
// clients do in a cluster) is served by net/http's HTTP/2 server, which
// does the protocol's framing: SETTINGS, flow control, the limit of
// concurrent streams, PING, a client's RST_STREAM (the stream's request
// context ends, and with it the attempt in flight), GOAWAY on drain.
// Each stream is one request, and it goes through the same calls as a
// request on an HTTP/1.1 connection: prepare (an exchange or a refusal),
// Runner.Run (the attempts, witness and engine), and the answer
// (h2stream.respond). Only the writing of the answer differs: through the
// stream's http.ResponseWriter, and for a gRPC call egret answers itself,
// as Trailers-Only with a grpc-status.
//
// One net/http Server per connection: its Handler is the connection
// (h2conn), so that every stream knows its connection's original
// destination without a value carried in a context.

// h2cProtocols: a pod's HTTP/2 connection is served with prior knowledge
// over cleartext, and nothing else.
var h2cProtocols = func() *http.Protocols {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &p
}()

// h2FullPreface is the client connection preface of HTTP/2.
const h2FullPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// h2conn is a pod's HTTP/2 connection: its server, and the streams being
// served (for Shutdown's cut).
type h2conn struct {
	c   *conn
	srv *http.Server
	// goingAway: Shutdown has told the client GOAWAY (guarded by c.s.mu).
	goingAway bool

	mu      sync.Mutex
	streams map[*http.ResponseController]struct{}
}

// serveH2 serves c, whose client sent the HTTP/2 preface, until the
// connection ends. net/http's server reads the preface (still in c.br)
// itself.
func (c *conn) serveH2() {
	cfg := &c.s.cfg
	// The sniff saw the preface's first line; the whole of it must follow
	// (RFC 9113 section 3.4: anything else is a connection error, and the
	// connection just ends). net/http's server would answer it as
	// HTTP/1.1 instead.
	c.c.SetReadDeadline(time.Now().Add(cfg.SniffTimeout))
	p, err := c.br.Peek(len(h2FullPreface))
	c.c.SetReadDeadline(time.Time{})
	if err != nil || string(p) != h2FullPreface {
		cfg.Logger.Debug("not an HTTP/2 connection preface", "client", c.c.RemoteAddr().String(), "err", err)
		return
	}
	// The server reads the connection itself, after the bytes the sniff
	// buffered: c.br is not read again (end resets it once the server's
	// reader may still be running).
	buffered, _ := c.br.Peek(c.br.Buffered())
	ended := make(chan struct{})
	ln := &connListener{c: &prefixedConn{Conn: c.c, prefix: bytes.Clone(buffered)}, done: make(chan struct{}), ended: ended}
	h := &h2conn{c: c, streams: map[*http.ResponseController]struct{}{}}
	h.srv = &http.Server{
		Handler:        h,
		Protocols:      h2cProtocols,
		IdleTimeout:    cfg.IdleTimeout,
		MaxHeaderBytes: cfg.MaxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
		// Each stream's context ends with the server's too (Shutdown's
		// cut), and forwarding sends its attempts with it.
		BaseContext: func(net.Listener) context.Context { return c.s.ctx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				close(ended)
			}
		},
	}
	c.h2 = h
	c.s.setState(c, stateH2)
	c.s.cfg.Metrics.servedH2()
	// Serve returns once the connection has ended, or earlier when
	// Shutdown (goAway) closes the listener; the connection is served on
	// until its end either way.
	h.srv.Serve(ln)
	<-ended
}

// ServeHTTP serves one stream: one request, read top to bottom as
// conn.handle reads: prepare, Runner.Run, respond.
func (h *h2conn) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	c := h.c
	start := time.Now()
	id := newRequestID()
	st := &h2stream{c: c, w: w, rc: http.NewResponseController(w), grpc: retry.IsGRPC(req.Header)}
	if !h.track(st.rc) {
		c.shutdownAnswer(st, req, id, start, "egret shut down as the request came")
		return
	}
	defer h.untrack(st.rc)
	if req.Method == http.MethodConnect {
		c.refuse(st, req, id, start, http.StatusMethodNotAllowed, "egret does not forward CONNECT over HTTP/2")
		return
	}
	x, rf := c.prepare(req, nil, id, start, st.bodySource(req))
	defer c.release(x)
	if rf != nil {
		c.refused(st, req, id, start, rf)
		return
	}
	res := c.s.runner.Run(&x.rx)
	st.respond(req, x, res, start)
}

// track registers a stream being served, unless Shutdown's cut has come
// (false): the cut interrupts the body reads of the registered ones.
func (h *h2conn) track(rc *http.ResponseController) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.c.s.cut.Load() {
		return false
	}
	h.streams[rc] = struct{}{}
	return true
}

func (h *h2conn) untrack(rc *http.ResponseController) {
	h.mu.Lock()
	delete(h.streams, rc)
	h.mu.Unlock()
}

// goAway tells the client that no new stream will be served (GOAWAY);
// the connection ends once its streams are answered. Called with c.s.mu
// held, once.
func (h *h2conn) goAway() {
	h.goingAway = true
	go h.srv.Shutdown(context.Background())
}

// interrupt ends the body reads of every stream being served (Shutdown's
// cut, set before): a deadline in the past, the pattern spool.Source
// checks for.
func (h *h2conn) interrupt() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for rc := range h.streams {
		rc.SetReadDeadline(aLongTimeAgo)
	}
}

// h2stream is one stream of a pod's HTTP/2 connection, as forwarding
// reads and answers it.
type h2stream struct {
	c  *conn
	w  http.ResponseWriter
	rc *http.ResponseController
	// grpc: the request is a gRPC call (read before forwarding takes its
	// header).
	grpc bool
}

// bodySource is the stream's body: none when the request ended with its
// header (Content-Length 0), else the stream's body, whose reads get
// their deadlines through the stream's ResponseController.
func (st *h2stream) bodySource(req *http.Request) source {
	s := source{rd: st.rc}
	if req.ContentLength != 0 && req.Body != nil && req.Body != http.NoBody {
		s.r = req.Body
	}
	return s
}

// respond answers the stream with what the run gave: the response
// relayed, or egret's own answer for a run that got none.
func (st *h2stream) respond(req *http.Request, x *exchange, res retry.Result, start time.Time) {
	if res.Err == nil && res.Response.StatusCode == http.StatusSwitchingProtocols {
		res = unaskedSwitch(res) // an HTTP/2 request never asks to switch
	}
	if res.Err != nil {
		f := st.c.failed(x, res)
		st.answer(req, &answer{id: x.ID, status: f.status, outcome: f.outcome.String(), attempts: f.attempts,
			msg: res.Err.Error()})
		st.c.logOutcome(req, x, f.attempts, f.outcome.String(), f.status, start, res.Err, f.tr)
		return
	}
	st.relay(req, x, res, start)
}

// relay writes the upstream's response to the stream as it comes: its
// header less the hop-by-hop fields and egret's own, egret's fields, the
// body flushed as it comes, and the upstream's trailers (a gRPC call's
// grpc-status). A body that breaks, or a client that cannot take it,
// ends the stream with RST_STREAM (http.ErrAbortHandler), never with a
// clean end that could pass for the whole answer.
func (st *h2stream) relay(req *http.Request, x *exchange, res retry.Result, start time.Time) {
	c, resp := st.c, res.Response
	n, ambiguous := c.relayed(x, res)
	outcome := outcomeLabel(ambiguous)
	h := st.w.Header()
	relayFields(h, resp.Header, "")
	// Nothing net/http would add of its own: no sniffed Content-Type, no
	// Date the upstream did not send.
	for _, k := range [...]string{"Content-Type", "Date"} {
		if _, ok := h[k]; !ok {
			h[k] = nil
		}
	}
	h[HeaderRequestID] = []string{x.ID}
	h[HeaderAttempts] = []string{strconv.Itoa(n)}
	if ambiguous {
		h[HeaderOutcome] = []string{outcome}
	}
	noBody := bodiless(req, resp)
	switch {
	case noBody && req.Method == http.MethodHead:
		if cl := field(resp.Header, "Content-Length"); cl != "" {
			h["Content-Length"] = []string{cl}
		}
	case !noBody && resp.ContentLength >= 0 && !retry.IsGRPC(resp.Header):
		// gRPC frames its messages itself and sends no Content-Length
		// (a Trailers-Only answer is a HEADERS frame alone).
		h["Content-Length"] = []string{strconv.FormatInt(resp.ContentLength, 10)}
	}
	st.rc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	st.w.WriteHeader(resp.StatusCode)
	var readErr, writeErr error
	if !noBody {
		readErr, writeErr = st.copyBody(resp.Body, resp.ContentLength)
	}
	if readErr == nil && writeErr == nil {
		relayFields(h, resp.Trailer, http.TrailerPrefix)
	}
	resp.Body.Close()
	tr := res.Finish(readErr)
	c.s.putTrace(tr)
	err := writeErr
	if err == nil {
		err = readErr
	}
	c.logOutcome(req, x, n, outcome, resp.StatusCode, start, err, tr)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
}

// relayFields copies to h the fields of from that a relayed response
// keeps (relayedField), their names prefixed with prefix.
func relayFields(h, from http.Header, prefix string) {
	conns := from["Connection"]
	for k, vs := range from {
		if !relayedField(conns, k) {
			continue
		}
		out := make([]string, len(vs))
		for i, v := range vs {
			out[i] = relayedValue(v)
		}
		h[prefix+k] = out
	}
}

// copyBody streams a response body to the stream, flushing as bytes come
// but for the last ones (those that reach its length, or come with its
// end): they go with the stream's end, in one DATA frame, when the
// handler returns. It returns the body's error (readErr, for the run's
// Finish) or the stream's (writeErr). length is the body's, -1 when
// unknown.
func (st *h2stream) copyBody(r io.Reader, length int64) (readErr, writeErr error) {
	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	buf := *bufp
	var sent int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			sent += int64(n)
			st.rc.SetWriteDeadline(time.Now().Add(st.c.s.cfg.WriteTimeout))
			if _, werr := st.w.Write(buf[:n]); werr != nil {
				return nil, werr
			}
			if err == nil && sent != length {
				if werr := st.rc.Flush(); werr != nil {
					return nil, werr
				}
			}
		}
		if err == io.EOF {
			return nil, nil
		}
		if err != nil {
			return err, nil
		}
	}
}

// answer writes a response egret makes itself to the stream. A gRPC call
// gets it as Trailers-Only (one HEADERS frame that ends the stream):
// :status 200, a grpc-status that says what became of the call
// (grpcCode) and its reason in grpc-message, with egret's fields;
// anything else gets a's status and a line of text, as on HTTP/1.1.
func (st *h2stream) answer(req *http.Request, a *answer) bool {
	h := st.w.Header()
	a.fields(h)
	st.rc.SetWriteDeadline(time.Now().Add(st.c.s.cfg.WriteTimeout))
	if st.grpc {
		h.Set("Content-Type", "application/grpc")
		h.Set(headerGRPCStatus, strconv.Itoa(grpcCode(a.outcome, a.status)))
		h.Set(headerGRPCMessage, grpcMessage(answerText(a.msg)))
		// No Flush: it would send the HEADERS alone and end the stream
		// with an empty DATA frame, which a gRPC client reads as response
		// headers and no trailers (grpc-go: INTERNAL, "server closed the
		// stream without sending trailers"), losing the grpc-status.
		// net/http's server sends the header with END_STREAM when the
		// handler returns having written no body: Trailers-Only.
		st.w.WriteHeader(http.StatusOK)
		return true
	}
	body := answerText(a.msg)
	if body != "" {
		body += "\n"
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	st.w.WriteHeader(a.status)
	if req != nil && req.Method == http.MethodHead {
		return st.rc.Flush() == nil
	}
	_, err := io.WriteString(st.w, body)
	return err == nil
}

// answerText is the text of an answer egret makes itself, "egret: " and
// msg ("" for none).
func answerText(msg string) string {
	if msg == "" {
		return ""
	}
	return "egret: " + strings.TrimPrefix(msg, "egret: ")
}

// prefixedConn reads prefix, then the connection.
type prefixedConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixedConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// connListener hands one connection to a net/http Server: Accept returns
// it once, then waits until the connection has ended or the listener is
// closed, and fails, so that Serve returns.
type connListener struct {
	c     net.Conn
	once  sync.Once
	done  chan struct{} // closed by Close
	ended chan struct{} // closed when the connection has ended
	took  bool
}

func (l *connListener) Accept() (net.Conn, error) {
	if !l.took {
		l.took = true
		return l.c, nil
	}
	select {
	case <-l.done:
	case <-l.ended:
	}
	return nil, net.ErrClosed
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.c.LocalAddr() }

var (
	_ answerer     = (*h2stream)(nil)
	_ answerer     = (*conn)(nil)
	_ net.Listener = (*connListener)(nil)
)
