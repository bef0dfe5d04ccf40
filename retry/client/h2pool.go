package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/witness"
)

// h2Conn is one pooled HTTP/2 connection.
type h2Conn struct {
	cc   *http.ClientConn
	nc   net.Conn // what GotConn reports: the *tls.Conn or the witness conn
	used bool
	// lastUse is when a stream was last reserved on it: a connection
	// with no stream in flight has been idle since then at most.
	lastUse time.Time
}

// h2Pool pools HTTP/2 client connections by address and calls
// http.ClientConn.RoundTrip directly, so that a refused stream or a GOAWAY
// reaches the retry Transport as it is (net/http's own pool would replay
// it on another connection).
//
// The connections are net/http's: ht.NewClientConn makes each one, HTTP/2
// only (h2 by ALPN over TLS, or with prior knowledge over TCP), through
// the HTTPTransport's dialers, so that the witness watches every socket.
type h2Pool struct {
	t  *HTTPTransport
	ht *http.Transport

	mu    sync.Mutex
	conns map[string][]*h2Conn
	// dialing holds the connection being made for an address: at most one
	// at a time, so the dialer ht calls knows whose it is.
	dialing map[string]*h2Dial
}

// h2Dial is one connection being made: done is closed when it ends, nc is
// the connection ht's dialer returned (nil until then), w the witness of
// the attempt it is made for (ht's dialer cannot be handed it).
type h2Dial struct {
	done chan struct{}
	nc   net.Conn
	w    witness.Witness
}

// errH1 says an https upstream chose http/1.1 by ALPN.
var errH1 = errors.New("upstream negotiated http/1.1")

func newH2Pool(t *HTTPTransport) *h2Pool {
	p := &h2Pool{t: t, conns: make(map[string][]*h2Conn), dialing: make(map[string]*h2Dial)}
	protos := new(http.Protocols)
	protos.SetHTTP2(true)
	protos.SetUnencryptedHTTP2(true) // without HTTP1: prior knowledge on http
	p.ht = &http.Transport{
		Protocols:              protos,
		DialContext:            p.dialPlain,
		DialTLSContext:         p.dialTLS,
		DisableCompression:     t.opts.DisableCompression,
		IdleConnTimeout:        t.opts.IdleConnTimeout * 8,
		MaxResponseHeaderBytes: t.opts.MaxResponseHeaderBytes,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout: 30 * time.Second,
			PingTimeout:     10 * time.Second,
		},
	}
	return p
}

// roundTrip runs one attempt of req on a pooled HTTP/2 connection. a is
// the runner's attempt (nil: none); order the field order, for the
// HTTP/1.1 client should the upstream pick http/1.1 (HTTP/2 sends names in
// lower case, in its own order).
func (p *h2Pool) roundTrip(req *http.Request, addr string, useTLS bool, a *attempt.Ctx, order []string) (*http.Response, error) {
	// net/http's HTTP/2 reports through httptrace only.
	ctx, h2req := req.Context(), req
	var w witness.Witness
	if a != nil {
		ctx, w = httptrace.WithClientTrace(ctx, a.Trace().ClientTrace()), a.Trace().Witness
	}
	if a != nil || emptyBodyMarked(req) {
		h2req = req.WithContext(ctx)
	}
	if emptyBodyMarked(req) {
		// Only net/http's HTTP/1 needs it; HTTP/2 would send an empty DATA.
		h2req.Body, h2req.TransferEncoding = nil, nil
	}
	trace := httptrace.ContextClientTrace(ctx)
	if trace != nil && trace.GetConn != nil {
		trace.GetConn(addr)
	}
	// A connection that became unusable before our stream was opened
	// wrote nothing of this request: taking another one is not a retry.
	risky := !idempotentMethod(req.Method)
	if a != nil {
		risky = a.Trace().Risky
	}
	key := poolKey{req.URL.Scheme, addr}
	var bound attempt.IdleBound
	if risky {
		bound = p.t.h1.bounds.bound(key, p.t.h1.now())
	}
	if a != nil {
		a.Trace().SetIdleBound(bound)
	}
	for try := 0; ; try++ {
		c, reused, idle, err := p.get(ctx, addr, useTLS, w, bound)
		if errors.Is(err, errH1) {
			return p.t.h1.roundTrip(req, a, order)
		}
		if err != nil {
			return nil, err
		}
		if trace != nil && trace.GotConn != nil {
			trace.GotConn(httptrace.GotConnInfo{Conn: c.nc, Reused: reused})
		}
		resp, err := c.cc.RoundTrip(h2req)
		if err != nil && h2ConnFaultOf(err) == h2Unusable && try < 3 {
			continue
		}
		if err != nil && reused && idle > 0 && !StreamRefused(err) && (peerClosed(err) || errors.Is(err, attempt.ErrFrozen)) {
			// The upstream dropped the idle connection as the stream came.
			p.t.h1.bounds.closed(key, idle, p.t.h1.now())
		}
		return resp, err
	}
}

// get returns a connection with a stream reserved for the caller; a
// connection it dials is watched by w (nil: none). With a bound (a request
// that is not safely idempotent), a connection with no stream in flight
// that has been idle for the bound's limit or longer is passed over. idle
// is how long the connection it returns had no stream (0: streams in
// flight, or new).
func (p *h2Pool) get(ctx context.Context, addr string, useTLS bool, w witness.Witness, bound attempt.IdleBound) (*h2Conn, bool, time.Duration, error) {
	for dials := 0; ; {
		p.mu.Lock()
		live := p.conns[addr][:0]
		var found *h2Conn
		var idle time.Duration
		now := p.t.h1.now()
		for _, c := range p.conns[addr] {
			var quiet time.Duration
			if c.cc.InFlight() == 0 {
				quiet = now.Sub(c.lastUse)
			}
			tooIdle := bound.Source != attempt.IdleBoundNone && quiet > 0 && quiet >= bound.Limit
			if found == nil && !tooIdle && c.cc.Reserve() == nil {
				found, idle = c, quiet
				c.lastUse = now
				live = append(live, c)
				continue
			}
			if c.cc.Err() != nil || c.cc.InFlight() == 0 && c.cc.Available() == 0 {
				// Closed, or closing (a GOAWAY) with no stream left.
				c.cc.Close()
				continue
			}
			live = append(live, c)
		}
		clear(p.conns[addr][len(live):])
		p.conns[addr] = live
		if found != nil {
			reused := found.used
			found.used = true
			p.mu.Unlock()
			return found, reused, idle, nil
		}
		if d, ok := p.dialing[addr]; ok {
			p.mu.Unlock()
			select {
			case <-d.done:
				continue
			case <-ctx.Done():
				return nil, false, 0, ctx.Err()
			}
		}
		if dials == 3 {
			p.mu.Unlock()
			return nil, false, 0, fmt.Errorf("no HTTP/2 connection to %s takes a new stream", addr)
		}
		dials++
		d := &h2Dial{done: make(chan struct{}), w: w}
		p.dialing[addr] = d
		p.mu.Unlock()

		c, err := p.dial(ctx, addr, useTLS, d)
		p.mu.Lock()
		delete(p.dialing, addr)
		close(d.done)
		if err != nil {
			p.mu.Unlock()
			return nil, false, 0, err
		}
		p.conns[addr] = append(p.conns[addr], c)
		ok := c.cc.Reserve() == nil
		c.used = true
		c.lastUse = p.t.h1.now()
		p.mu.Unlock()
		if ok {
			return c, false, 0, nil
		}
	}
}

// dial makes a new HTTP/2 connection to addr; ht calls dialPlain or
// dialTLS for its socket, which record it in d.
func (p *h2Pool) dial(ctx context.Context, addr string, useTLS bool, d *h2Dial) (*h2Conn, error) {
	scheme := "http"
	if useTLS {
		scheme = "https"
	}
	cc, err := p.ht.NewClientConn(ctx, scheme, addr)
	p.mu.Lock()
	nc := d.nc
	p.mu.Unlock()
	switch {
	case err != nil && nc == nil:
		return nil, err // from our dialer: a *DialError, or errH1
	case err != nil:
		return nil, fmt.Errorf("http2 connection to %s: %w", addr, err)
	case nc == nil:
		// net/http dialled under another address than ours: the witness
		// would not see this connection.
		cc.Close()
		return nil, fmt.Errorf("http2 connection to %s: not made by egret's dialer", addr)
	}
	return &h2Conn{cc: cc, nc: nc}, nil
}

// dialPlain is ht's dialer for h2c.
func (p *h2Pool) dialPlain(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := p.t.dialPlain(ctx, network, addr, p.witnessFor(addr))
	if err != nil {
		return nil, err
	}
	p.dialed(addr, c)
	return c, nil
}

// dialTLS is ht's dialer for https: a connection that negotiated anything
// but h2 by ALPN goes to the HTTP/1.1 client instead (errH1).
func (p *h2Pool) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	tc, err := p.t.dialTLS(ctx, network, addr, []string{"h2", "http/1.1"}, p.witnessFor(addr))
	if err != nil {
		return nil, err
	}
	if tc.ConnectionState().NegotiatedProtocol != "h2" {
		p.t.alpn.Store(addr, time.Now().Add(10*time.Minute))
		p.t.stash.put(addr, tc)
		return nil, errH1
	}
	p.dialed(addr, tc)
	return tc, nil
}

// witnessFor is the witness of the attempt addr's connection is being
// made for.
func (p *h2Pool) witnessFor(addr string) witness.Witness {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.dialing[addr]; d != nil {
		return d.w
	}
	return nil
}

// dialed records nc as the connection being made for addr, shared by the
// streams of every request that will use it.
func (p *h2Pool) dialed(addr string, nc net.Conn) {
	if wc := attempt.ConnOf(nc); wc != nil {
		wc.MarkShared()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.dialing[addr]; d != nil {
		d.nc = nc
	}
}

// closeAddr takes addr's connections out of the pool, so that none carries
// another request, and closes the idle ones; a busy one is closed by
// net/http's idle timeout once its streams end.
func (p *h2Pool) closeAddr(addr string) {
	p.mu.Lock()
	l := p.conns[addr]
	delete(p.conns, addr)
	p.mu.Unlock()
	for _, c := range l {
		if c.cc.InFlight() == 0 {
			c.cc.Close()
		}
	}
}

func (p *h2Pool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, l := range p.conns {
		live := l[:0]
		for _, c := range l {
			if c.cc.InFlight() == 0 {
				c.cc.Close()
				continue
			}
			live = append(live, c)
		}
		clear(l[len(live):])
		p.conns[addr] = live
	}
}
