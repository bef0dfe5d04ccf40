package client

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/egret-proxy/egret/internal/rawsock"
	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/witness"
)

// HTTPOptions configures the one-attempt transport built by NewHTTPTransport.
// The zero value is usable: pooled HTTP/1.1 with keep-alive, no HTTP/2.
type HTTPOptions struct {
	// DialContext dials the upstream's TCP connection; the agent sets it to
	// dial from inside a pod's network namespace. nil: a net.Dialer with
	// DialTimeout, KeepAlive and Mark.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialTimeout bounds the TCP connect (0: 10 s). Ignored with DialContext.
	DialTimeout time.Duration
	// KeepAlive is the TCP keep-alive period (0: 15 s, negative: off).
	KeepAlive time.Duration
	// Mark sets SO_MARK on upstream sockets (Linux; 0: none), so that the
	// agent's own connections are not redirected back to itself.
	Mark int
	// TLS is the client configuration for https upstreams (TLS origination).
	// nil: the system roots. NextProtos is managed by the transport.
	TLS *tls.Config
	// TLSHandshakeTimeout bounds a TLS handshake (0: 10 s).
	TLSHandshakeTimeout time.Duration
	// HTTP2 offers h2 by ALPN to https upstreams; H2C speaks HTTP/2 with
	// prior knowledge to http upstreams.
	HTTP2 bool
	H2C   bool
	// MaxIdleConnsPerHost (0: 64), MaxConnsPerHost (0: no limit) and
	// IdleConnTimeout (0: 4 s, below the 5 s keep-alive of common servers,
	// so that a pooled connection is rarely reused just as the server
	// closes it) size the HTTP/1.1 pool.
	MaxIdleConnsPerHost int
	MaxConnsPerHost     int
	IdleConnTimeout     time.Duration
	// DisableCompression stops HTTP/2 from asking for gzip on its own (a
	// proxy relays the client's Accept-Encoding as it is). HTTP/1.1 never
	// adds Accept-Encoding nor decompresses.
	DisableCompression bool
	// MaxResponseHeaderBytes limits a response's head (0: 1 MiB).
	MaxResponseHeaderBytes int64
	// Clock tells the time by which the HTTP/1.1 pool measures how long a
	// connection has been idle (nil: time.Now); an injected clock lets a
	// test move idle time without sleeping.
	Clock func() time.Time
}

// ErrRequestInvalid: the request cannot be sent as it is (a method,
// header field or host the wire cannot carry, a body that disagrees with
// its Content-Length). It has no prefix of its own; package retry reports
// it as its own ErrRequestInvalid, the same value.
var ErrRequestInvalid = errors.New("invalid request")

// DialError is an error from opening the upstream connection, before any
// byte of a request could be written on it. Op is "dial" (name resolution
// and TCP connect) or "tls" (the TLS handshake).
type DialError struct {
	Op   string
	Addr string
	Err  error
}

func (e *DialError) Error() string { return e.Op + " " + e.Addr + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *DialError) Unwrap() error { return e.Err }

// HTTPTransport runs one attempt of a request on pooled connections, and
// never more than one: HTTP/1.1 on a client of its own (h1.go; net/http's
// Transport replays requests by itself), HTTP/2 on net/http's
// http.ClientConn, on connections it pools itself (h2pool.go; net/http's
// own pool retries refused streams and GOAWAYs). Every connection it opens
// can be watched by a kernel witness.
type HTTPTransport struct {
	opts  HTTPOptions
	h1    *h1Pool
	h2    *h2Pool
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	stash connStash // TLS conns that negotiated http/1.1, handed to h1
	alpn  sync.Map  // addr -> time.Time until which the addr is known http/1.1
}

var _ http.RoundTripper = (*HTTPTransport)(nil)

// NewHTTPTransport builds the default one-attempt transport.
func NewHTTPTransport(opts HTTPOptions) *HTTPTransport {
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.KeepAlive == 0 {
		opts.KeepAlive = 15 * time.Second
	}
	if opts.TLSHandshakeTimeout <= 0 {
		opts.TLSHandshakeTimeout = 10 * time.Second
	}
	if opts.MaxIdleConnsPerHost <= 0 {
		opts.MaxIdleConnsPerHost = 64
	}
	if opts.IdleConnTimeout <= 0 {
		opts.IdleConnTimeout = 4 * time.Second
	}
	t := &HTTPTransport{opts: opts}
	if opts.DialContext != nil {
		t.dial = tracedDial(opts.DialContext)
	} else {
		d := &net.Dialer{Timeout: opts.DialTimeout, KeepAlive: opts.KeepAlive}
		if opts.Mark != 0 {
			mark := opts.Mark
			d.Control = func(network, address string, c syscall.RawConn) error { return setMark(c, mark) }
		}
		t.dial = d.DialContext // net.Dialer reports DNS and connect to httptrace itself
	}
	t.h1 = newH1Pool(t)
	t.h1.clock = opts.Clock
	if opts.HTTP2 || opts.H2C {
		t.h2 = newH2Pool(t)
	}
	return t
}

// RoundTrip runs one attempt, reporting to any httptrace.ClientTrace of
// the request's context. It never retries.
func (t *HTTPTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.Send(req, nil, nil)
}

// Send runs one attempt of req. a, when the retry runner hands it, is
// the attempt itself: the context that bounds it (req's) and the trace
// its evidence goes to, reported directly rather than through httptrace.
// order is the header field order (Exchange.FieldOrder; nil: by name),
// which HTTP/2 ignores. It never retries.
func (t *HTTPTransport) Send(req *http.Request, a *attempt.Ctx, order []string) (*http.Response, error) {
	if req.URL == nil {
		return nil, errors.New("request without URL")
	}
	if t.h2 != nil {
		addr := CanonicalAddr(req.URL)
		switch req.URL.Scheme {
		case "http":
			if t.opts.H2C {
				return t.h2.roundTrip(req, addr, false, a, order)
			}
		case "https":
			if t.opts.HTTP2 && !t.knownH1(addr) {
				return t.h2.roundTrip(req, addr, true, a, order)
			}
		}
	}
	return t.h1.roundTrip(req, a, order)
}

// CloseIdleConnections closes every idle pooled connection.
func (t *HTTPTransport) CloseIdleConnections() {
	t.h1.closeIdle()
	if t.h2 != nil {
		t.h2.closeIdle()
	}
	t.stash.closeAll()
}

// CloseAddr closes the pooled connections to addr (host:port) and keeps the
// ones still carrying an exchange from being pooled again: addr left its
// upstream (an endpoint that left a Kubernetes Service), and no connection
// to it may carry another request. HTTP/2 connections to it are closed
// once idle.
func (t *HTTPTransport) CloseAddr(addr string) {
	t.h1.closeAddr(addr)
	if t.h2 != nil {
		t.h2.closeAddr(addr)
	}
	if c := t.stash.take(addr); c != nil {
		c.Close()
	}
}

func (t *HTTPTransport) knownH1(addr string) bool {
	v, ok := t.alpn.Load(addr)
	return ok && time.Now().Before(v.(time.Time))
}

// dialPlain opens a TCP connection wrapped for the witness; w (nil: none)
// is the witness of the attempt it is dialled for.
func (t *HTTPTransport) dialPlain(ctx context.Context, network, addr string, w witness.Witness) (net.Conn, error) {
	c, err := t.dial(ctx, network, addr)
	if err == nil {
		c = rawsock.Wrap(c)
	}
	if err != nil {
		return nil, &DialError{Op: "dial", Addr: addr, Err: err}
	}
	wc := attempt.NewConn(c)
	if w != nil {
		// Armed from birth, so that a failure before the request is even
		// handed to the connection leaves a snapshot.
		wc.ArmAtBirth(w)
	}
	return wc, nil
}

// tracedDial reports a custom dialer's work to the request's httptrace as
// a connect, so that a timeout inside it is told as connect_timeout.
func tracedDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		trace := httptrace.ContextClientTrace(ctx)
		if trace != nil && trace.ConnectStart != nil {
			trace.ConnectStart(network, addr)
		}
		c, err := dial(ctx, network, addr)
		if trace != nil && trace.ConnectDone != nil {
			trace.ConnectDone(network, addr, err)
		}
		return c, err
	}
}

// dialTLSH1 is net/http's TLS dialer: a connection that already negotiated
// http/1.1 by ALPN first, else a new one offering only http/1.1.
func (t *HTTPTransport) dialTLSH1(ctx context.Context, network, addr string, w witness.Witness) (net.Conn, error) {
	if c := t.stash.take(addr); c != nil {
		return c, nil
	}
	return t.dialTLS(ctx, network, addr, []string{"http/1.1"}, w)
}

// dialTLS opens a TCP connection and runs the TLS handshake on it, firing
// the TLS hooks of the request's httptrace.
func (t *HTTPTransport) dialTLS(ctx context.Context, network, addr string, protos []string, w witness.Witness) (*tls.Conn, error) {
	raw, err := t.dialPlain(ctx, network, addr, w)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{}
	if t.opts.TLS != nil {
		cfg = t.opts.TLS.Clone()
	}
	cfg.NextProtos = protos
	if cfg.ServerName == "" {
		host, _, _ := net.SplitHostPort(addr)
		cfg.ServerName = host
	}
	tc := tls.Client(raw, cfg)
	trace := httptrace.ContextClientTrace(ctx)
	if trace != nil && trace.TLSHandshakeStart != nil {
		trace.TLSHandshakeStart()
	}
	hctx, cancel := context.WithTimeout(ctx, t.opts.TLSHandshakeTimeout)
	err = tc.HandshakeContext(hctx)
	cancel()
	if err == nil {
		if wc := attempt.ConnOf(raw); wc != nil {
			wc.Reborn()
		}
	}
	if trace != nil && trace.TLSHandshakeDone != nil {
		trace.TLSHandshakeDone(tc.ConnectionState(), err)
	}
	if err != nil {
		raw.Close()
		return nil, &DialError{Op: "tls", Addr: addr, Err: err}
	}
	return tc, nil
}

// CanonicalAddr is the URL's host:port with the scheme's default port.
func CanonicalAddr(u *url.URL) string {
	port := u.Port()
	if port != "" && u.Hostname() != "" && !strings.Contains(u.Hostname(), "%") {
		return u.Host // already host:port (an IPv6 literal in brackets)
	}
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// connStash keeps TLS connections that negotiated http/1.1 while the h2
// pool probed the upstream, so that net/http's pool uses them.
type connStash struct {
	mu sync.Mutex
	m  map[string][]net.Conn
}

func (s *connStash) put(addr string, c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string][]net.Conn)
	}
	if len(s.m[addr]) >= 4 {
		c.Close()
		return
	}
	s.m[addr] = append(s.m[addr], c)
}

func (s *connStash) take(addr string) net.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.m[addr]
	if len(l) == 0 {
		return nil
	}
	c := l[len(l)-1]
	s.m[addr] = l[:len(l)-1]
	return c
}

func (s *connStash) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, l := range s.m {
		for _, c := range l {
			c.Close()
		}
		delete(s.m, k)
	}
}
