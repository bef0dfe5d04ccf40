package proxy

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/h1"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/proxy/spool"
	"github.com/egret-proxy/egret/retry"
	"github.com/egret-proxy/egret/retry/client"
)

// Headers the proxy reads or writes (spec section 6). The request id and
// the outcome are the attempt runner's own headers: it reads the one and
// marks an ambiguous status with the other.
const (
	HeaderRequestID = retry.HeaderRequestID
	HeaderAttempts  = "Egret-Attempts"
	HeaderOutcome   = retry.HeaderOutcome
	// HeaderTimeoutMs shortens the request's overall deadline
	// (milliseconds; it never lengthens it). It is not forwarded.
	HeaderTimeoutMs = "Egret-Timeout-Ms"
)

// exchange is one forwarded request on its way upstream, in one
// allocation: who the upstream is, the one value handed to the retry
// layer (rx: the outgoing request, its policy, the base transport, the
// field order, the bulkhead), the upstream URL and request, the values of
// the header fields the proxy adds, and what the request holds of its
// pod's limits until it is answered (release).
type exchange struct {
	ID string
	// Identity is who the upstream is, decided once when the request
	// came, with the policy entry that applies (Identity.Upstream).
	Identity Identity
	rx       retry.Exchange
	url      url.URL
	vals     [2]string
	req      http.Request // the upstream request (outgoing), in this allocation

	upgrade bool        // the request asks to switch protocols
	body    *spool.Body // nil: none
	hold    spoolHold   // the body's share of the pod's spool bytes and descriptors
	slot    bool        // a request slot of the pod's InFlight is held
}

// Request ids: a random base chosen at start, plus a count, through a
// bijection of 64-bit numbers (the finaliser of MurmurHash3), so that ids
// are unique within the process, unrelated between processes, and look no
// more alike than random ones, at the cost of a few multiplications rather
// than a read of the system's random source per request.
var (
	idBase = func() uint64 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		return binary.LittleEndian.Uint64(b[:])
	}()
	idCount atomic.Uint64
)

// newRequestID returns a fresh request id: 16 hex digits.
func newRequestID() string {
	x := idBase + idCount.Add(1)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[x&15]
		x >>= 4
	}
	return string(b[:])
}

// target is where a request goes: the URL the upstream request uses, the
// host the policy is matched by, and the port.
type target struct {
	url  url.URL
	host string // for policy matching and TLS server name
	port int
}

// handle serves one parsed request and reports whether the connection may
// carry another. order is its header field names as sent (parseHead).
// It reads top to bottom: prepare (an exchange, or a refusal), one call to
// the retry layer (Runner.Run: the attempts and the engine's decisions),
// then respond (the answer, and the run's end).
func (c *conn) handle(req *http.Request, order []string, head []byte, start time.Time) bool {
	id := newRequestID()
	if c.passOn(req, head, id, start) {
		return false
	}
	x, rf := c.prepare(req, order, id, start, c.bodySource(req))
	defer c.release(x)
	if rf != nil {
		c.refused(c, req, id, start, rf)
		return false
	}
	res := c.s.runner.Run(&x.rx)
	return c.respond(req, x, res, start)
}

// passOn serves a request that is not forwarded with retries: a CONNECT
// (a tunnel), or in transparent mode the pod speaking to its own forward
// proxy (HTTP(S)_PROXY), carried to the original destination as it was
// sent. It reports whether it served req (the connection then ends).
func (c *conn) passOn(req *http.Request, head []byte, id string, start time.Time) bool {
	switch {
	case c.s.cfg.Mode == Transparent && (req.Method == http.MethodConnect || req.URL.IsAbs()):
		c.forwardProxy(req, head, id, start)
	case req.Method == http.MethodConnect:
		c.tunnel(req, id, start)
	default:
		return false
	}
	return true
}

// refusal is why prepare will not forward a request, and how it is
// answered (refused).
type refusal struct {
	status int // the status of refuse; 0 with no kind below: no answer, the connection ends
	msg    string
	// limit: the pod has no room (limitAnswer, 503 not-sent); shutdown:
	// Shutdown's cut ended the request before any of it went upstream
	// (shutdownAnswer).
	limit    int
	isLimit  bool
	shutdown bool
}

// answerer writes a response the proxy makes itself, in the protocol of
// the request: an HTTP/1.1 connection (conn) or an HTTP/2 stream
// (h2stream). It reports whether the answer was written.
type answerer interface {
	answer(req *http.Request, a *answer) bool
}

// refused answers a request prepare refused, through w.
func (c *conn) refused(w answerer, req *http.Request, id string, start time.Time, rf *refusal) {
	switch {
	case rf.shutdown:
		c.shutdownAnswer(w, req, id, start, rf.msg)
	case rf.isLimit:
		c.limitAnswer(w, req, id, start, rf.limit, rf.msg)
	case rf.status != 0:
		c.refuse(w, req, id, start, rf.status, rf.msg)
	}
}

// prepare works out what req means and makes its exchange: where it goes
// and whether it may (admit), who the upstream is and its retry policy
// (identity, routePolicy), the pod's room for it and its body (takeBody),
// and the one value handed to the retry layer (build). Or it says why the
// request is refused. What the exchange took of the pod's limits is given
// back by release, refused or not.
func (c *conn) prepare(req *http.Request, order []string, id string, start time.Time, src source) (*exchange, *refusal) {
	x := &exchange{ID: id}
	tg, shorten, rf := c.admit(req, x)
	if rf != nil {
		return x, rf
	}
	x.Identity = c.identity(tg)
	rp := c.routePolicy(req, x.Identity, shorten)
	if rf := c.takeBody(req, x, start, src); rf != nil {
		return x, rf
	}
	return x, c.build(req, x, tg, rp, order)
}

// admit says where req goes (target) and whether it may go there, and
// reads the request's own shortening of its deadline (HeaderTimeoutMs).
func (c *conn) admit(req *http.Request, x *exchange) (tg target, shorten time.Duration, rf *refusal) {
	cfg := &c.s.cfg
	tg, err := c.target(req)
	if err != nil {
		return tg, 0, &refusal{status: http.StatusBadRequest, msg: err.Error()}
	}
	if cfg.Via != "" && viaLoops(req.Header, cfg.Via) {
		return tg, 0, &refusal{status: http.StatusLoopDetected, msg: "request already went through this proxy (Via)"}
	}
	if cfg.Mode == Explicit {
		if err := c.s.checkTarget(tg.host, tg.port); err != nil {
			return tg, 0, &refusal{status: http.StatusForbidden, msg: err.Error()}
		}
	}
	// A request asking to switch protocols is HTTP until the upstream's
	// 101: framed, forwarded and answered as any other. Its switch is a
	// tunnel, so it goes only where a CONNECT may.
	x.upgrade = client.AsksUpgrade(req)
	if x.upgrade {
		if err := c.upgradeAllowed(tg); err != nil {
			return tg, 0, &refusal{status: http.StatusForbidden, msg: err.Error()}
		}
	}
	if v := field(req.Header, HeaderTimeoutMs); v != "" {
		ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || ms <= 0 || ms > 1<<40 {
			return tg, 0, &refusal{status: http.StatusBadRequest, msg: "bad " + HeaderTimeoutMs + " " + strconv.Quote(v)}
		}
		shorten = time.Duration(ms) * time.Millisecond
	}
	if v := field(req.Header, headerGRPCTimeout); v != "" {
		d, ok := grpcTimeout(v)
		if !ok {
			return tg, 0, &refusal{status: http.StatusBadRequest, msg: "bad " + headerGRPCTimeout + " " + strconv.Quote(v)}
		}
		if shorten == 0 || d < shorten {
			shorten = d
		}
	}
	return tg, shorten, nil
}

// identity decides, once, who the upstream of a request to tg is: its
// entry, budget and bulkhead, and whether its credential may go there.
func (c *conn) identity(tg target) Identity {
	cfg := &c.s.cfg
	pol := cfg.Policy.Current()
	var ident Identity
	byService := false
	if cfg.Services != nil && cfg.Mode == Transparent {
		ident, byService = c.service(c.s.ctx, pol, tg)
	}
	if !byService {
		ident = c.identify(c.s.ctx, pol, tg)
	}
	if ident.Proof == ProofMismatch {
		cfg.Metrics.hostMismatch()
	}
	return ident
}

// routePolicy is the retry policy of req to the upstream ident: its
// entry's route, the identity's budget, the refresher only where the
// credential may go, and the deadline shortened by the request. With
// inject_idempotency_key, it adds a fresh Idempotency-Key to a request
// that is not idempotent otherwise.
func (c *conn) routePolicy(req *http.Request, ident Identity, shorten time.Duration) policy.Retry {
	up := ident.Upstream
	hasKey := field(req.Header, policy.IdempotencyKeyHeader) != ""
	rp := up.RetryPolicy(req.Method, req.URL.Path)
	rp.Upstream = ident.Budget
	if !ident.Credential {
		rp.Refresh = nil
	}
	if up.InjectsKey(rp.Idempotency, req.Method, hasKey) {
		req.Header.Set(policy.IdempotencyKeyHeader, policy.NewIdempotencyKey())
	}
	if shorten > 0 && (rp.Timeout <= 0 || shorten < rp.Timeout) {
		rp.Timeout = shorten
		if rp.AttemptTimeout > shorten {
			rp.AttemptTimeout = shorten
		}
	}
	return rp
}

// takeBody takes the pod's slot for one more request in flight (held
// until it is answered), says 100 Continue when the client waits for it,
// and reads the body from src: held, spooled or streamed once (spec
// section 1).
func (c *conn) takeBody(req *http.Request, x *exchange, start time.Time, src source) *refusal {
	cfg := &c.s.cfg
	q := cfg.Quota
	if !q.takeRequest() {
		return &refusal{isLimit: true, limit: limitInFlight,
			msg: fmt.Sprintf("this pod is at its limit of %d requests in flight", q.Limits().InFlight)}
	}
	x.slot = true
	if src.h1 && field(req.Header, "Expect") != "" && (req.ContentLength != 0 || chunked(req)) {
		c.c.SetWriteDeadline(time.Now().Add(cfg.WriteTimeout))
		c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		if c.bw.Flush() != nil {
			return &refusal{} // the client is gone: nothing to answer
		}
	}
	var err error
	x.body, x.hold, err = c.readBody(req, x.Identity.Upstream.Body, start, src)
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, ErrLimit):
		return &refusal{isLimit: true, limit: limitSpool,
			msg: fmt.Sprintf("this pod is at its limit of %d request-body bytes held", q.Limits().SpoolBytes)}
	case errors.Is(err, ErrNoDescriptors):
		return &refusal{isLimit: true, limit: limitDescriptors, msg: "egret is out of file descriptors for request bodies"}
	case c.s.cut.Load():
		return &refusal{shutdown: true, msg: "egret shut down while the request body was being read"}
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &refusal{status: http.StatusRequestTimeout, msg: "request body not received in time"}
	case errors.Is(err, h1.ErrMalformed):
		return &refusal{status: http.StatusBadRequest, msg: err.Error()}
	case errors.Is(err, spool.ErrShortBody):
		return &refusal{} // the client went before its body's end
	}
	return &refusal{status: http.StatusInternalServerError, msg: err.Error()}
}

// build fills the one value handed to the retry layer: the policy, the
// field order, the bulkhead, the base transport for the upstream's
// protocol, a Service's endpoints, and the outgoing request.
func (c *conn) build(req *http.Request, x *exchange, tg target, rp policy.Retry, order []string) *refusal {
	up := x.Identity.Upstream
	x.rx.Policy = retryPolicy(rp)
	x.rx.FieldOrder = order
	if b := c.s.cfg.Bulkheads.Get(x.Identity.Budget, up.Bulkhead); b != nil {
		x.rx.Bulkhead = b
	}
	proto := up.Protocol
	switch {
	case x.upgrade:
		proto = policy.ProtocolHTTP1
	case req.ProtoMajor == 2:
		// A pod's HTTP/2 goes on as HTTP/2, whatever the entry says: a
		// gRPC call (trailers, streams both ways) cannot be carried by
		// HTTP/1.1. With prior knowledge (h2c), or h2 where the entry
		// originates TLS.
		proto = policy.ProtocolH2C
		if up.TLS.Enabled {
			proto = policy.ProtocolH2
		}
	}
	var err error
	x.rx.Base, err = c.s.bases.get(up, x.Identity.Host, proto)
	if err != nil {
		return &refusal{status: http.StatusBadGateway, msg: err.Error()}
	}
	x.rx.Endpoints = x.Identity.Endpoints
	x.rx.Note = x.Identity.ServiceNote
	x.rx.Request = c.outgoing(req, tg, x.body, x, x.upgrade)
	return nil
}

// release gives back what x held of the pod's limits once its request is
// answered (or refused): its body, its spool bytes and descriptor, its
// request slot.
func (c *conn) release(x *exchange) {
	if x.body != nil {
		x.body.Release()
	}
	q := c.s.cfg.Quota
	q.putHold(x.hold)
	if x.slot {
		q.putRequest()
	}
}

// respond answers the request with what the run gave (relay, or
// answerFailure, or for a switch of protocols switched) and ends the run
// (Result.Finish, inside each). It reports whether the connection may
// carry another request.
func (c *conn) respond(req *http.Request, x *exchange, res retry.Result, start time.Time) bool {
	body := x.body
	// A one-shot body the upstream has not read to its end leaves the rest
	// on the connection: answer with Connection: close.
	keep := !req.Close && !c.s.closing.Load() && (body == nil || body.Done())
	if res.Err == nil && res.Response.StatusCode == http.StatusSwitchingProtocols {
		if c.switchAsked(req, x, res) {
			c.switched(req, x, res, start)
			return false
		}
		res = unaskedSwitch(res)
	}
	// Each answer stores the request's trace before the client has the
	// whole answer: a client that asks for its explanation as soon as it
	// has read its answer finds it.
	if res.Err != nil {
		keep = c.answerFailure(req, x, res, start, keep)
	} else {
		keep = c.relay(req, x, res, start, keep)
	}
	if body != nil && !body.Done() {
		// The upstream did not read the whole one-shot body: the rest is
		// still on the connection; the lingering close drains it, once the
		// transport has let go of the connection's reader.
		keep = false
		body.Detach()
	}
	return keep
}

// switchAsked reports whether a 101 answers the switch req asked for. The
// base checked that it does; one that did not (another Runner) is no
// answer, nor is one whose body is not the connection, or one that came
// before the request's body was all read.
func (c *conn) switchAsked(req *http.Request, x *exchange, res retry.Result) bool {
	_, conn := res.Response.Body.(io.ReadWriteCloser)
	return x.upgrade && conn && !req.Close && (x.body == nil || x.body.Done())
}

// unaskedSwitch ends the run of a 101 nobody asked for and makes it a
// failure to answer: 502 failed.
func unaskedSwitch(res retry.Result) retry.Result {
	res.Response.Body.Close()
	tr := res.Finish(nil)
	return retry.Result{Err: &retry.Error{Outcome: engine.OutcomeFailed, Status: http.StatusBadGateway,
		Attempts: attemptsOf(tr, nil), Trace: tr, Err: errUnaskedSwitch}, Trace: tr}
}

// shutdownAnswer answers a request that Shutdown ended before any of it
// was sent upstream: 503 not-sent, logged.
func (c *conn) shutdownAnswer(w answerer, req *http.Request, id string, start time.Time, msg string) {
	notSent := engine.OutcomeNotSent.String()
	c.s.cfg.Metrics.request(notSent)
	w.answer(req, &answer{id: id, status: http.StatusServiceUnavailable, outcome: notSent, msg: msg, close: true})
	l := requestLog{id: id, outcome: notSent, status: http.StatusServiceUnavailable, start: start, err: msg}
	if req != nil {
		l.method, l.u = req.Method, req.URL
	}
	c.logRequest(l)
}

// limitAnswer answers a request its pod has no room for: 503 not-sent
// (nothing of it went upstream), counted and logged.
func (c *conn) limitAnswer(w answerer, req *http.Request, id string, start time.Time, kind int, msg string) {
	c.s.limitRefused(kind)
	notSent := engine.OutcomeNotSent.String()
	c.s.cfg.Metrics.request(notSent)
	w.answer(req, &answer{id: id, status: http.StatusServiceUnavailable, outcome: notSent, msg: msg, close: true})
	c.logRequest(requestLog{id: id, method: req.Method, u: req.URL, outcome: notSent,
		status: http.StatusServiceUnavailable, start: start, err: msg})
}

// target works out where req goes. Explicit mode takes the absolute-form
// URL; transparent mode the original destination, with the Host header
// naming the upstream for the policy and the upstream's virtual host.
func (c *conn) target(req *http.Request) (target, error) {
	if c.s.cfg.Mode == Explicit {
		u := req.URL
		if !u.IsAbs() || u.Host == "" {
			return target{}, errors.New("not a proxy request: the request target must be an absolute URL")
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return target{}, fmt.Errorf("unsupported scheme %q", u.Scheme)
		}
		host := u.Hostname()
		port := 80
		if u.Scheme == "https" {
			port = 443
		}
		if p := u.Port(); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n <= 0 || n > 65535 {
				return target{}, fmt.Errorf("bad port %q", p)
			}
			port = n
		}
		return target{url: *u, host: host, port: port}, nil
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if host == "" {
		host = c.dstHost
	}
	// Absolute-form requests never come here (handle passes them
	// through): the request target is origin-form.
	u := url.URL{
		Scheme:   "http",
		Host:     c.dstAddr,
		Path:     req.URL.Path,
		RawPath:  req.URL.RawPath,
		RawQuery: req.URL.RawQuery,
	}
	return target{url: u, host: host, port: int(c.dst.Port())}, nil
}

// source is where a request's body comes from: r is the body (nil: the
// request has none), rd what its reads wait on. On an HTTP/1.1
// connection (h1) r decodes the body's framing from the connection's
// reader, rd is the connection, and the client that waits for 100
// Continue is told to go on; on an HTTP/2 stream r is the stream's body
// and rd the stream's http.ResponseController (net/http's server says 100
// Continue itself, on the body's first read).
type source struct {
	r  io.Reader
	rd spool.Deadliner
	h1 bool
}

// bodySource is the source of the body of req, a request on c.
func (c *conn) bodySource(req *http.Request) source {
	return source{r: bodyReader(req, c.br), rd: c.c, h1: true}
}

// readBody holds the request body as its size and the upstream's limits
// say (nil: the request has none), read from s as spool.Source bounds it:
// ReadTimeout each read, RequestReadTimeout from start all of them,
// Shutdown's cut at once. The body's Detach lets the connection take its
// reader back from a one-shot body that the transport may still be
// reading. hold is what the body took of the pod's spool bytes and of the
// node's descriptors (given back once the request is answered, even on
// error): a body of known length that will be held takes its length before
// a byte is read; one of unknown length takes what it holds as it is read
// (an HTTP/2 stream's, its memory limit at once); one that may go to a
// spool file, a descriptor. A body that would pass the pod's limit fails
// with ErrLimit; one with no descriptor for its file, with
// ErrNoDescriptors.
func (c *conn) readBody(req *http.Request, lim policy.BodyLimits, start time.Time, s source) (b *spool.Body, hold spoolHold, err error) {
	if s.r == nil {
		return nil, spoolHold{}, nil
	}
	src := spool.Source{R: s.r, Conn: s.rd, Each: c.s.cfg.ReadTimeout, Until: start.Add(c.s.cfg.RequestReadTimeout), Cut: &c.s.cut}
	cl := req.ContentLength
	if chunked(req) {
		cl = -1
	}
	q := c.s.cfg.Quota
	if cl < 0 && !s.h1 {
		// An HTTP/2 stream of unknown length (a gRPC call) goes as it
		// comes, its first MemoryLimit bytes kept for a retry: its client
		// may wait for the answer before it sends the rest. What it may
		// keep is taken at once.
		if !q.takeSpool(lim.MemoryLimit) {
			return nil, spoolHold{}, errSpoolLimit
		}
		return spool.ReadStream(src, lim.MemoryLimit), spoolHold{bytes: lim.MemoryLimit}, nil
	}
	var charge *spoolCharge
	switch {
	case cl < 0:
		charge = &spoolCharge{r: src.R, q: q}
		src.R = charge
	case cl > 0 && cl <= max(lim.MemoryLimit, lim.SpoolLimit):
		if !q.takeSpool(cl) {
			return nil, spoolHold{}, errSpoolLimit
		}
		hold.bytes = cl
	}
	if (cl < 0 || cl > lim.MemoryLimit) && lim.SpoolLimit > lim.MemoryLimit {
		// It may go to a spool file: a descriptor for it.
		if !q.takeSpoolFile() {
			q.putSpool(hold.bytes)
			return nil, spoolHold{}, errNoSpoolFile
		}
		hold.file = true
	}
	b, err = spool.Read(src, cl, spool.Limits{Memory: lim.MemoryLimit, Spool: lim.SpoolLimit, Dir: c.s.cfg.SpoolDir})
	if charge != nil {
		// What was read is what the body holds; the rest of a one-shot
		// body is streamed, not held.
		charge.stop = true
		hold.bytes = charge.held
	}
	return b, hold, err
}

// outgoing builds the upstream request. Its header is the client
// request's, changed in place: the proxy reads no header of req after this,
// and the request sent upstream (whose header the attempt runner owns from
// now on) is the only user of it.
func (c *conn) outgoing(req *http.Request, tg target, body *spool.Body, x *exchange, upgrade bool) *http.Request {
	h := req.Header
	req.Header = nil
	upg := h["Upgrade"]
	removeHopHeaders(h)
	if upgrade {
		// The switch asked for goes on: Connection names only it.
		h["Connection"] = []string{"Upgrade"}
		h["Upgrade"] = upg
	}
	delete(h, "Expect") // the proxy already has the body
	x.vals[0] = x.ID
	h[HeaderRequestID] = x.vals[0:1:1]
	if c.s.cfg.Mode == Explicit && c.s.cfg.Via != "" {
		x.vals[1] = c.s.via(req.ProtoMajor, req.ProtoMinor)
		if vs := h["Via"]; len(vs) > 0 {
			h["Via"] = append(vs, x.vals[1])
		} else {
			h["Via"] = x.vals[1:2:2]
		}
	}
	x.url = tg.url
	if x.Identity.Upstream.TLS.Enabled {
		x.url.Scheme = "https"
	}
	tmpl := http.Request{
		Method:     req.Method,
		URL:        &x.url,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     h,
		Host:       req.Host,
	}
	// The attempts end with the server's context (Shutdown's cut); an
	// HTTP/2 stream's also ends when the client resets the stream or the
	// connection ends (its server's BaseContext is the server's
	// context), which is a client abort as a closed HTTP/1.1 connection
	// is. Either only cancels.
	ctx := c.s.ctx
	if req.ProtoMajor == 2 {
		ctx = req.Context()
	}
	x.req = *tmpl.WithContext(ctx) // WithContext's copy stays on the stack
	out := &x.req
	if c.s.cfg.Mode == Explicit {
		out.Host = tg.url.Host
	}
	if x.Identity.Credential {
		x.Identity.Upstream.Refresher().Apply(out) // the upstream's bearer credential (renewed after a 401)
	}
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = nil // send none rather than Go's
	}
	if body == nil || body.BodyKind() == engine.BodyNone {
		out.Body = http.NoBody
	} else {
		out.Body = body
		if body.BodyKind() == engine.BodyReplayable {
			// Held in memory: the first attempt reads it as the retries
			// do, through a reader net/http knows to be in memory, so
			// that the request head and body leave in one write(2)
			// rather than the head flushed on its own.
			if r, err := body.Reopen(); err == nil {
				out.Body = r
			}
		}
		out.ContentLength = body.Len() // -1: unknown, sent chunked
		if body.BodyKind() != engine.BodyOneShot {
			out.GetBody = body.Reopen
		}
	}
	return out
}

// attemptsOf is the number of dispatches of the request to the upstream,
// from the runner's trace of it (tr) or else its error: the runner's
// attempts, plus the ones net/http made on its own inside an attempt (a
// replay on a fresh connection, Attempt.HiddenRetries), since each of them
// may have reached the server.
func attemptsOf(tr *retry.Trace, err error) int {
	if tr != nil && len(tr.Attempts) > 0 {
		n := len(tr.Attempts)
		for i := range tr.Attempts {
			n += tr.Attempts[i].HiddenRetries
		}
		return n
	}
	if err == nil {
		return 1
	}
	if n := retry.AttemptsOf(err); n > 0 {
		return n
	}
	return 1
}

// answerFailure answers a request that got no response to relay (spec
// section 6).
func (c *conn) answerFailure(req *http.Request, x *exchange, res retry.Result, start time.Time, keep bool) bool {
	f := c.failed(x, res)
	ok := c.answer(req, &answer{id: x.ID, status: f.status, outcome: f.outcome.String(), attempts: f.attempts,
		msg: res.Err.Error(), close: !keep})
	c.logOutcome(req, x, f.attempts, f.outcome.String(), f.status, start, res.Err, f.tr)
	return keep && ok
}

// failure is what a run that got no response to relay is answered with.
type failure struct {
	status   int
	outcome  engine.Outcome
	attempts int
	tr       *retry.Trace
}

// failed ends the run of res, which got no response to relay, and works
// out its answer (whatever the protocol it is written in): the status
// and outcome of its error, its attempts; the outcome is counted and the
// final trace stored.
func (c *conn) failed(x *exchange, res retry.Result) failure {
	err, tr := res.Err, res.Finish(nil) // complete already: the run ended with err
	status, outcome := http.StatusBadGateway, engine.OutcomeFailed
	var ae *retry.AmbiguousError
	var re *retry.Error
	switch {
	case errors.As(err, &ae):
		status, outcome = ae.Status, engine.OutcomeAmbiguous
	case errors.As(err, &re):
		// A request_invalid attempt is not_sent too: the spec answers
		// every not-sent outcome 503, a request the runner could not
		// send included.
		status, outcome = re.Status, re.Outcome
	}
	if status == 0 {
		status = http.StatusBadGateway
	}
	outcome = c.cutAfterHead(tr, outcome)
	n := attemptsOf(tr, err)
	c.s.cfg.Metrics.request(outcome.String())
	c.s.cfg.Metrics.Workload(c.s.cfg.Source, x.Identity.Budget, x.Identity.Upstream != nil && x.Identity.Upstream.Named(), outcome.String(), n, tr)
	c.s.putTrace(tr)
	return failure{status: status, outcome: outcome, attempts: n, tr: tr}
}

// cutAfterHead is the rule for a request that Shutdown's cut (its grace
// over, the attempts cancelled) finds after the upstream's response head
// came and before a byte of the response reached the client: it is
// answered, never left with a connection that ends without a word. The
// runner returns a response only once it holds the body's first chunk (or
// its end), so a cut there is an attempt that broke in its body
// (partial_response), answered here by answerFailure: 502 failed when the
// request is idempotent (sending it again is safe), 502 with
// Egret-Outcome ambiguous when it is not. The engine calls a non-idempotent
// partial response "failed" (the upstream answered, so it ran); but here
// egret itself cut an answer the upstream may have meant as a success, and
// the client cannot know what became of its request: ambiguous, the answer
// that says not to send it again blindly. From the first byte relay
// writes, the response has begun and the cut resets the connection
// instead (a clean end could pass for the body's).
func (c *conn) cutAfterHead(tr *retry.Trace, o engine.Outcome) engine.Outcome {
	if o == engine.OutcomeFailed && c.s.cut.Load() && tr != nil && !tr.Idempotent {
		return engine.OutcomeAmbiguous
	}
	return o
}

// relay writes the upstream's response to the client as it comes. It
// reports whether the connection may carry another request. The head goes
// out with the body's first chunk, which the runner holds before it
// returns a response: once relay writes, the body has begun (bodyBegun),
// and Shutdown's cut can only reset the connection (see cutAfterHead).
func (c *conn) relay(req *http.Request, x *exchange, res retry.Result, start time.Time, keep bool) bool {
	resp, tr := res.Response, res.Trace
	closed := false
	defer func() {
		if !closed {
			resp.Body.Close()
			res.Finish(nil)
		}
	}()
	n, ambiguous := c.relayed(x, res)
	outcome := outcomeLabel(ambiguous)
	// The upstream's header is written as it is minus what removeHopHeaders
	// would remove and the headers the proxy writes itself, without a copy.
	cl := ""
	if !namedBy(resp.Header["Connection"], "Content-Length") {
		cl = field(resp.Header, "Content-Length")
	}
	noBody := bodiless(req, resp)
	status := resp.StatusCode
	text := http.StatusText(status)
	if _, t, ok := strings.Cut(resp.Status, " "); ok && t != "" {
		text = t
	}
	c.c.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	bw := c.bw
	bw.WriteString("HTTP/1.1 ")
	for p := 100; p > 1 && status < p; p /= 10 { // %03d
		bw.WriteByte('0')
	}
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(status), 10))
	bw.WriteByte(' ')
	bw.WriteString(text)
	bw.WriteString("\r\n")
	writeRelayedHeader(bw, resp.Header)
	writeField(bw, HeaderRequestID, x.ID)
	writeField(bw, HeaderAttempts, strconv.Itoa(n))
	if ambiguous {
		writeField(bw, HeaderOutcome, outcome)
	}
	chunk := false
	switch {
	case noBody:
		if cl != "" && req.Method == http.MethodHead {
			writeField(bw, "Content-Length", cl)
		}
	case resp.ContentLength >= 0:
		writeField(bw, "Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	case req.ProtoAtLeast(1, 1):
		writeField(bw, "Transfer-Encoding", "chunked")
		chunk = true
	default:
		keep = false // the end of the body is the end of the connection
	}
	if !keep {
		writeField(bw, "Connection", "close")
	}
	bw.WriteString("\r\n")
	var readErr, copyErr error
	if !noBody {
		defer c.bodyBegun.Store(false)
		readErr, copyErr = c.copyBody(resp.Body, chunk, resp.ContentLength)
		if copyErr == nil {
			copyErr = readErr
		}
	}
	// The body is read to its end (or broke, or was abandoned, or there
	// is none): closed, the run finished in one call, and its final trace
	// stored before the answer's last bytes go out.
	resp.Body.Close()
	closed = true
	tr = res.Finish(readErr)
	c.s.putTrace(tr)
	if copyErr == nil {
		copyErr = c.bw.Flush()
	}
	c.logOutcome(req, x, n, outcome, status, start, copyErr, tr)
	if copyErr != nil {
		c.abort()
		return false
	}
	return keep
}

// relayed counts the relayed response of res and says its attempts and
// whether its status is an ambiguous one.
func (c *conn) relayed(x *exchange, res retry.Result) (attempts int, ambiguous bool) {
	resp, tr := res.Response, res.Trace
	n := attemptsOf(tr, nil)
	// Egret-Outcome on a relayed response is the runner's mark of an
	// ambiguous status, never the upstream's own header.
	if tr != nil {
		ambiguous = tr.Outcome == engine.OutcomeAmbiguous
	} else if !namedBy(resp.Header["Connection"], HeaderOutcome) {
		ambiguous = field(resp.Header, HeaderOutcome) == engine.OutcomeAmbiguous.String()
	}
	outcome := outcomeLabel(ambiguous)
	c.s.cfg.Metrics.request(outcome)
	c.s.cfg.Metrics.Workload(c.s.cfg.Source, x.Identity.Budget, x.Identity.Upstream != nil && x.Identity.Upstream.Named(), outcome, n, tr)
	return n, ambiguous
}

// bodiless reports whether resp, the answer to req, has no body whatever
// its header says.
func bodiless(req *http.Request, resp *http.Response) bool {
	return req.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent ||
		resp.StatusCode == http.StatusNotModified || resp.StatusCode < 200
}

// copyBody streams a response body to the client, flushing as bytes come,
// but for the last bytes (those that reach its length, or come with the
// end): the caller flushes them once the request's trace is stored. A body
// that breaks returns its error (readErr, for the run's Finish), a client
// that cannot take it the write's (writeErr): either way the caller aborts
// the connection, never ending the body cleanly. length is the body's, -1
// when unknown.
func (c *conn) copyBody(r io.Reader, chunk bool, length int64) (readErr, writeErr error) {
	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	buf := *bufp
	var sent int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			sent += int64(n)
			if !c.bodyBegun.Load() {
				c.bodyBegun.Store(true) // from here on, Shutdown's cut resets
			}
			c.c.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
			last := err == io.EOF || sent == length
			switch {
			case chunk:
				h1.WriteChunk(c.bw, buf[:n]) // the end is the last chunk, written at EOF
			case last:
				// A large write goes straight through the buffer; the
				// last byte is held back in it whatever the size.
				c.bw.Write(buf[:n-1])
				c.bw.WriteByte(buf[n-1])
			default:
				c.bw.Write(buf[:n])
			}
			if !last {
				if werr := c.bw.Flush(); werr != nil {
					if err == io.EOF {
						err = nil
					}
					return err, werr
				}
			}
		}
		if err == io.EOF {
			if chunk {
				h1.EndChunks(c.bw)
			}
			return nil, nil
		}
		if err != nil {
			return err, nil
		}
	}
}

// outcomeLabel is a relayed response's outcome.
func outcomeLabel(ambiguous bool) string {
	if ambiguous {
		return engine.OutcomeAmbiguous.String()
	}
	return labelRelayed
}

// field is h.Get(k) for a canonical k, without canonicalizing it again.
func field(h http.Header, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// writeField writes one header field the proxy sets itself (a value it
// made: no newline to replace).
func writeField(w *bufio.Writer, k, v string) {
	w.WriteString(k)
	w.WriteString(": ")
	w.WriteString(v)
	w.WriteString("\r\n")
}

// relayExcludeBase is what a relayed response's header loses: the
// hop-by-hop headers and the ones the proxy writes itself.
var relayExcludeBase = func() map[string]bool {
	m := map[string]bool{"Content-Length": true, HeaderRequestID: true, HeaderAttempts: true, HeaderOutcome: true}
	for _, k := range hopHeaders {
		m[k] = true
	}
	return m
}()

// writeRelayedHeader writes the fields of h that a relayed response keeps:
// all but relayExcludeBase, the Proxy-* fields and the fields a Connection
// field names (what removeHopHeaders would remove), in the form
// http.Header.Write gives them: sorted by name, a field with an invalid
// name left out, CR and LF in a value turned into spaces, values trimmed.
func writeRelayedHeader(w *bufio.Writer, h http.Header) {
	conns := h["Connection"]
	var buf [32]string
	keys := buf[:0]
	for k := range h {
		if relayedField(conns, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range h[k] {
			writeField(w, k, relayedValue(v))
		}
	}
}

// relayedField reports whether a relayed response keeps its field k
// (canonical): not one of relayExcludeBase, a Proxy-* field, one a
// Connection field (conns) names, or one with an invalid name.
func relayedField(conns []string, k string) bool {
	return !relayExcludeBase[k] && !strings.HasPrefix(k, "Proxy-") && !namedBy(conns, k) &&
		httpguts.ValidHeaderFieldName(k)
}

// relayedValue is a relayed field's value v as http.Header.Write gives it:
// CR and LF turned into spaces, trimmed.
func relayedValue(v string) string {
	if strings.ContainsAny(v, "\r\n") {
		v = newlineToSpace.Replace(v)
	}
	return textproto.TrimString(v)
}

var newlineToSpace = strings.NewReplacer("\n", " ", "\r", " ")

// namedBy reports whether one of the Connection field values conns names
// the field k (canonical), which removeHopHeaders would remove.
func namedBy(conns []string, k string) bool {
	for _, v := range conns {
		for f := range strings.SplitSeq(v, ",") {
			if asciiEqualFold(textproto.TrimString(f), k) {
				return true
			}
		}
	}
	return false
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (c *conn) logOutcome(req *http.Request, x *exchange, attempts int, outcome string, status int, start time.Time, err error, tr *retry.Trace) {
	reason, denied := lastDecision(tr)
	c.logRequest(requestLog{id: x.ID, method: req.Method, u: req.URL, upstream: x.Identity.Budget,
		attempts: attempts, outcome: outcome, reason: reason, denied: denied, status: status, start: start, e: err})
}

// requestLog is the one log line of a request; empty upstream, zero status
// and no error are left out. The url is url, or else u's; the error err,
// or else e's: each is made only when the line is logged. reason is the
// last decision's (empty: "none"); denied says it denied a retry for a
// reason other than the status rules (Config.AccessLog).
type requestLog struct {
	id, method, url, upstream string
	u                         *url.URL
	attempts                  int
	outcome                   string
	reason                    string
	denied                    bool
	status                    int
	start                     time.Time
	err                       string
	e                         error
}

// logRequest logs l at level Info, if Config.AccessLog wants it. It gives
// the record to the logger's handler itself, as Logger.LogAttrs would but
// without looking up the caller's program counter: the line's source would
// be this function whoever logged, and no handler egret builds adds it.
func (c *conn) logRequest(l requestLog) {
	now := time.Now()
	c.s.cfg.Metrics.answered(l.outcome, now.Sub(l.start))
	c.tap(&l, now)
	ctx := context.Background()
	h := c.s.cfg.Logger.Handler()
	if !c.s.cfg.AccessLog.logged(&l) || !h.Enabled(ctx, slog.LevelInfo) {
		return
	}
	if l.reason == "" {
		l.reason = reasonNone
	}
	if l.url == "" && l.u != nil {
		l.url = c.s.logURL(l.u)
	}
	if l.err == "" && l.e != nil {
		l.err = l.e.Error()
	}
	r := slog.NewRecord(now, slog.LevelInfo, "request", 0)
	// slog.Attr values rather than key-value pairs: no boxing of each
	// value, one array on the stack.
	var buf [10]slog.Attr
	attrs := append(buf[:0], slog.String("id", l.id), slog.String("method", l.method), slog.String("url", l.url))
	if l.upstream != "" {
		attrs = append(attrs, slog.String("upstream", l.upstream))
	}
	attrs = append(attrs, slog.Int("attempts", l.attempts), slog.String("outcome", l.outcome), slog.String("reason", l.reason))
	if l.status != 0 {
		attrs = append(attrs, slog.Int("status", l.status))
	}
	attrs = append(attrs, slog.Duration("duration", now.Sub(l.start)))
	if l.err != "" {
		attrs = append(attrs, slog.String("err", l.err))
	}
	r.AddAttrs(attrs...)
	_ = h.Handle(ctx, r)
}

// errUnaskedSwitch: a 101 that answers no request to switch.
var errUnaskedSwitch = errors.New("the upstream answered 101 Switching Protocols to a request that cannot switch")

// upgradeAllowed says why the switch tg's request asks for may not be
// made, or nil. In explicit mode the upgraded connection is a tunnel to
// the target: it may reach only the ports a CONNECT may (ConnectPorts),
// and the target's address was checked as a CONNECT's is (a name is
// checked as dialled). In transparent mode it goes to the original
// destination, which the pod reaches without egret anyway.
func (c *conn) upgradeAllowed(tg target) error {
	if c.s.cfg.Mode != Explicit || slices.Contains(c.s.cfg.ConnectPorts, tg.port) {
		return nil
	}
	return fmt.Errorf("Upgrade to port %d is not allowed: an upgraded connection is a tunnel, and tunnels reach only the ports %v", tg.port, c.s.cfg.ConnectPorts)
}

// switched answers a request the upstream switched protocols for: the 101
// goes to the client (the upstream's fields less the hop-by-hop ones, the
// switch's Connection and Upgrade, egret's own), the request is logged
// (outcome upgrade) and its trace stored, and the connection is handed to
// the loop to be piped (c.upgradedTo): from here on its bytes are not
// HTTP. Everything of the request was read before the switch (the base
// writes the whole request before it hands over the connection).
func (c *conn) switched(req *http.Request, x *exchange, res retry.Result, start time.Time) {
	resp, tr := res.Response, res.Finish(nil) // complete already: the run ended with the switch
	n := attemptsOf(tr, nil)
	c.s.putTrace(tr)
	c.s.cfg.Metrics.request(labelRelayed)
	c.s.cfg.Metrics.Workload(c.s.cfg.Source, x.Identity.Budget, x.Identity.Upstream != nil && x.Identity.Upstream.Named(), labelRelayed, n, tr)
	c.s.cfg.Metrics.passedThrough(ProtoUpgrade)
	// A tunnel from here: Shutdown's cut resets it (checked after the
	// state is set, as the cut sets cut before it looks at states).
	c.s.setState(c, stateTunnel)
	l := requestLog{id: x.ID, method: req.Method, u: req.URL, upstream: x.Identity.Budget, attempts: n,
		outcome: "upgrade", status: http.StatusSwitchingProtocols, start: start}
	if c.s.cut.Load() {
		resp.Body.Close()
		c.abort()
		l.err = "egret shut down as the upstream switched protocols"
		c.logRequest(l)
		return
	}
	c.c.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	bw := c.bw
	bw.WriteString("HTTP/1.1 101 Switching Protocols\r\n")
	writeRelayedHeader(bw, resp.Header)
	writeField(bw, "Connection", "Upgrade")
	for _, v := range resp.Header["Upgrade"] {
		writeField(bw, "Upgrade", textproto.TrimString(v))
	}
	writeField(bw, HeaderRequestID, x.ID)
	writeField(bw, HeaderAttempts, strconv.Itoa(n))
	bw.WriteString("\r\n")
	if err := bw.Flush(); err != nil {
		resp.Body.Close()
		l.e = err
		c.logRequest(l)
		return
	}
	c.logRequest(l)
	c.upgradedTo = resp.Body.(io.ReadWriteCloser)
}

// forwardProxy carries a transparent connection whose client speaks to its
// own forward proxy (a CONNECT, or an absolute-form request) to the
// original destination byte for byte, head included and as it was sent:
// that destination is the pod's proxy, whose protocol egret keeps.
func (c *conn) forwardProxy(req *http.Request, head []byte, id string, start time.Time) {
	prefix := append([]byte(nil), head...)
	l := requestLog{id: id, method: req.Method, u: req.URL, attempts: 1, outcome: "forward_proxy",
		upstream: c.dstAddr, start: start}
	if req.Method == http.MethodConnect {
		l.u, l.url = nil, req.RequestURI
	}
	c.logRequest(l)
	c.passthrough(ProtoForwardProxy, c.dstAddr, prefix)
}

// viaLoops reports whether a Via header of h names pseudonym as a
// recipient: the request came back to the proxy that forwarded it.
func viaLoops(h http.Header, pseudonym string) bool {
	for _, v := range h["Via"] {
		for hop := range strings.SplitSeq(v, ",") {
			f := strings.Fields(hop)
			if len(f) >= 2 && f[1] == pseudonym {
				return true
			}
		}
	}
	return false
}

// retryPolicy is the one place the policy file's Retry becomes the attempt
// runner's Policy.
func retryPolicy(p policy.Retry) retry.Policy {
	return retry.Policy{
		Upstream:          p.Upstream,
		MaxAttempts:       p.MaxAttempts,
		Timeout:           p.Timeout,
		AttemptTimeout:    p.AttemptTimeout,
		MinAttempt:        p.MinAttempt,
		Backoff:           p.Backoff,
		Budget:            p.Budget,
		TransientStatuses: p.TransientStatuses,
		Idempotency:       p.Idempotency,
		Refresh:           p.Refresh,
	}
}
