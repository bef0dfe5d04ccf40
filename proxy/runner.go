package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"sync"

	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/retry"
)

// bases holds the one-attempt transports (retry.HTTPTransport) the runner
// dispatches attempts on: one per way of speaking to upstreams (protocol,
// TLS settings), so that connections are pooled per upstream setting and
// dialled through the server's DialFunc.
type bases struct {
	dial DialFunc
	mu   sync.Mutex
	m    map[string]*retry.HTTPTransport
	// tls maps a TLS protocol and server name to the key in m of the
	// transport made for its latest TLS configuration.
	tls map[string]string
}

func newBases(dial DialFunc) *bases {
	return &bases{dial: dial, m: make(map[string]*retry.HTTPTransport), tls: make(map[string]string)}
}

// get returns the transport for upstream u reached under host name host.
// A TLS transport is keyed by the content of the upstream's TLS
// configuration: when a reloaded policy read new files (a rotated CA or
// client certificate), a new transport is made, and the idle connections
// of the one it replaces are closed.
func (b *bases) get(u *policy.Upstream, host string) (http.RoundTripper, error) {
	key, slot, serverName := string(u.Protocol), "", ""
	if u.TLS.Enabled {
		if u.TLSConfigID() == "" {
			return nil, errors.New("TLS origination without a TLS configuration")
		}
		serverName = u.TLS.ServerName
		if serverName == "" {
			serverName = host
		}
		slot = string(u.Protocol) + "|tls|" + serverName
		key = slot + "|" + u.TLSConfigID()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if t := b.m[key]; t != nil {
		return t, nil
	}
	var tc *tls.Config
	if u.TLS.Enabled {
		tc = u.TLSConfig()
		tc.ServerName = serverName
		if old, ok := b.tls[slot]; ok {
			b.m[old].CloseIdleConnections()
			delete(b.m, old)
		}
		b.tls[slot] = key
	}
	opts := retry.HTTPOptions{
		DialContext:        b.dial,
		TLS:                tc,
		HTTP2:              u.Protocol == policy.ProtocolAuto || u.Protocol == policy.ProtocolH2,
		H2C:                u.Protocol == policy.ProtocolH2C,
		DisableCompression: true,
	}
	t := retry.NewHTTPTransport(opts)
	b.m[key] = t
	return t, nil
}

func (b *bases) closeIdle() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range b.m {
		t.CloseIdleConnections()
	}
}

// baseRouter is the runner's base transport: it sends each attempt on the
// transport chosen for the request's exchange.
type baseRouter struct{}

func (baseRouter) RoundTrip(req *http.Request) (*http.Response, error) {
	x := ExchangeFrom(req.Context())
	if x == nil || x.base == nil {
		return nil, errors.New("proxy: request without an exchange")
	}
	return x.base.RoundTrip(req)
}

// newRunner builds the attempt runner: a retry.Transport whose hooks are
// the server's (policy of the request's exchange, bulkhead, draining, trace
// store), counting into Config.RetryMetrics.
func (s *Server) newRunner() http.RoundTripper {
	return &retry.Transport{
		Base:     baseRouter{},
		Budgets:  s.cfg.Budgets,
		Witness:  s.cfg.Witness,
		Draining: s.Draining,
		Policy: func(req *http.Request) retry.Policy {
			if x := ExchangeFrom(req.Context()); x != nil {
				return x.Policy
			}
			return retry.DefaultPolicy("")
		},
		Acquire: func(ctx context.Context, upstream string) (func(), error) {
			var b *Bulkhead
			if x := ExchangeFrom(ctx); x != nil && x.Bulkhead != nil {
				b = x.Bulkhead
			} else {
				b = s.cfg.Bulkheads.Lookup(upstream)
			}
			if b == nil {
				return func() {}, nil
			}
			return b.Acquire(ctx)
		},
		OnTrace: s.putTrace,
		Metrics: s.cfg.RetryMetrics,
	}
}

var _ http.RoundTripper = baseRouter{}

// TracesAttempts: each base is a retry.HTTPTransport, which reports the
// attempts it runs to the runner directly (retry.DirectTracing).
func (baseRouter) TracesAttempts() bool { return true }

var _ retry.DirectTracing = baseRouter{}
