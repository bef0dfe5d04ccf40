// Package dnstest is a DNS server on loopback UDP for tests: it answers A
// and AAAA questions from a table the test sets (NXDOMAIN for any other
// name), so that code resolving names through a real net.Resolver can be
// tested with names of the test's choosing, over real sockets.
package dnstest

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Server answers DNS questions on a loopback UDP socket until the test
// ends.
type Server struct {
	pc      net.PacketConn
	mu      sync.Mutex
	names   map[string][]netip.Addr
	queries atomic.Int64
}

// Start serves on 127.0.0.1 (a free port), stopped in t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{pc: pc, names: map[string][]netip.Addr{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.serve()
	}()
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	return s
}

// Set makes name resolve to addrs (none: NXDOMAIN).
func (s *Server) Set(name string, addrs ...netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names[canonical(name)] = append([]netip.Addr(nil), addrs...)
}

// Queries is how many questions the server has answered.
func (s *Server) Queries() int64 { return s.queries.Load() }

// Addr is the server's address.
func (s *Server) Addr() string { return s.pc.LocalAddr().String() }

// Resolver is a Go resolver that asks this server only.
func (s *Server) Resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.Addr())
	}}
}

func canonical(name string) string { return strings.ToLower(strings.TrimSuffix(name, ".")) + "." }

func (s *Server) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp, ok := s.answer(buf[:n]); ok {
			_, _ = s.pc.WriteTo(resp, from)
		}
	}
}

func (s *Server) answer(req []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	s.queries.Add(1)
	s.mu.Lock()
	addrs, known := s.names[strings.ToLower(q.Name.String())]
	s.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	rr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}
	for _, a := range addrs {
		switch {
		case q.Type == dnsmessage.TypeA && a.Is4():
			rr.Type = dnsmessage.TypeA
			if b.AResource(rr, dnsmessage.AResource{A: a.As4()}) != nil {
				return nil, false
			}
		case q.Type == dnsmessage.TypeAAAA && a.Is6():
			rr.Type = dnsmessage.TypeAAAA
			if b.AAAAResource(rr, dnsmessage.AAAAResource{AAAA: a.As16()}) != nil {
				return nil, false
			}
		}
	}
	out, err := b.Finish()
	return out, err == nil
}
