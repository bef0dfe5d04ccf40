package proxy

import (
	"crypto/tls"
	"errors"
	"sync"

	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/retry"
	"github.com/egret-proxy/egret/retry/client"
)

// bases holds the one-attempt transports (client.HTTPTransport) a request's
// attempts run on (retry.Exchange.Base): one per way of speaking to
// upstreams (protocol, TLS settings), so that connections are pooled per
// upstream setting and dialled through the server's DialFunc.
type bases struct {
	dial DialFunc
	mu   sync.Mutex
	m    map[string]*client.HTTPTransport
	// tls maps a TLS protocol and server name to the key in m of the
	// transport made for its latest TLS configuration.
	tls map[string]string
}

func newBases(dial DialFunc) *bases {
	return &bases{dial: dial, m: make(map[string]*client.HTTPTransport), tls: make(map[string]string)}
}

// get returns the transport for upstream u reached under host name host,
// speaking proto (u.Protocol, or ProtocolHTTP1 for a request that asks to
// switch protocols, which only HTTP/1.1 can).
// A TLS transport is keyed by the content of the upstream's TLS
// configuration: when a reloaded policy read new files (a rotated CA or
// client certificate), a new transport is made, and the idle connections
// of the one it replaces are closed.
func (b *bases) get(u *policy.Upstream, host string, proto policy.Protocol) (*client.HTTPTransport, error) {
	key, slot, serverName := string(proto), "", ""
	if u.TLS.Enabled {
		if u.TLSConfigID() == "" {
			return nil, errors.New("TLS origination without a TLS configuration")
		}
		serverName = u.TLS.ServerName
		if serverName == "" {
			serverName = host
		}
		slot = string(proto) + "|tls|" + serverName
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
	opts := client.HTTPOptions{
		DialContext:        b.dial,
		TLS:                tc,
		HTTP2:              proto == policy.ProtocolAuto || proto == policy.ProtocolH2,
		H2C:                proto == policy.ProtocolH2C,
		DisableCompression: true,
	}
	t := client.NewHTTPTransport(opts)
	b.m[key] = t
	return t, nil
}

// closeAddrs closes every transport's connections to addrs (CloseAddr).
func (b *bases) closeAddrs(addrs []string) {
	b.mu.Lock()
	ts := make([]*client.HTTPTransport, 0, len(b.m))
	for _, t := range b.m {
		ts = append(ts, t)
	}
	b.mu.Unlock()
	for _, t := range ts {
		for _, a := range addrs {
			t.CloseAddr(a)
		}
	}
}

func (b *bases) closeIdle() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range b.m {
		t.CloseIdleConnections()
	}
}

// Runner runs one exchange's attempts: *retry.Runner, or a stand-in in
// tests of the server alone (Config.Runner).
type Runner interface {
	Run(*retry.Exchange) retry.Result
}

// newRunner builds the attempt runner: the node's budgets, the witness,
// the server's draining flag and the retry metrics. Everything else comes
// with each request's retry.Exchange (handle).
func (s *Server) newRunner() Runner {
	return &retry.Runner{
		Budgets:  s.cfg.Budgets,
		Witness:  s.cfg.Witness,
		Draining: &s.draining,
		Metrics:  s.cfg.RetryMetrics,
	}
}
