package ledger

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"
)

const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// Start returns a server listening on 127.0.0.1 (plain: HTTP/1.1 and h2c)
// that is closed when the test ends. Add more listeners with Listen and
// ListenTLS.
func Start(tb testing.TB) (*Server, net.Addr) {
	tb.Helper()
	s := New()
	addr, err := s.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("ledger: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s, addr
}

// Listen serves HTTP/1.1 and HTTP/2 with prior knowledge on a new listener
// (e.g. "tcp", "127.0.0.1:0" or "tcp6", "[::1]:0") and returns its address.
func (s *Server) Listen(network, address string) (net.Addr, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return s.Serve(ln)
}

// Serve serves HTTP/1.1 and HTTP/2 with prior knowledge on ln (a listener
// made elsewhere, for example inside another network namespace) until the
// server is closed, and returns its address.
func (s *Server) Serve(ln net.Listener) (net.Addr, error) {
	if !s.addListener(ln) {
		ln.Close()
		return nil, net.ErrClosed
	}
	s.wg.Add(1)
	go s.acceptLoop(ln, false)
	return ln.Addr(), nil
}

// ListenTLS serves TLS with ALPN (h2, then http/1.1) under the server's
// test CA (see CAPEM) on a new listener and returns its address. The
// certificate is valid for 127.0.0.1, ::1 and localhost.
func (s *Server) ListenTLS(network, address string) (net.Addr, error) {
	ca, err := s.testCA()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	if !s.addListener(ln) {
		ln.Close()
		return nil, net.ErrClosed
	}
	s.wg.Add(1)
	go s.acceptLoop(tls.NewListener(ln, ca.serverConfig()), true)
	return ln.Addr(), nil
}

func (s *Server) addListener(ln net.Listener) bool {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	select {
	case <-s.closed:
		return false
	default:
	}
	s.lns = append(s.lns, ln)
	return true
}

// Close stops every listener, closes every connection and waits for the
// server's goroutines.
func (s *Server) Close() error {
	s.lnMu.Lock()
	select {
	case <-s.closed:
		s.lnMu.Unlock()
		return nil
	default:
	}
	close(s.closed)
	for _, ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.lnMu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) track(c net.Conn, add bool) bool {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	if add {
		select {
		case <-s.closed:
			return false
		default:
		}
		s.conns[c] = struct{}{}
	} else {
		delete(s.conns, c)
	}
	return true
}

func (s *Server) acceptLoop(ln net.Listener, isTLS bool) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond) // not synchronisation: a pause after a failed accept (EMFILE, say), as net/http's
				continue
			}
			return
		}
		if !s.track(c, true) {
			c.Close()
			return
		}
		s.mu.Lock()
		s.notifyLocked()
		s.stats.Connections++
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.track(c, false)
			s.serveConn(c, isTLS)
		}()
	}
}

func (s *Server) idle() time.Duration {
	if s.IdleTimeout > 0 {
		return s.IdleTimeout
	}
	return time.Minute
}

func (s *Server) serveConn(c net.Conn, isTLS bool) {
	raw := c
	if tc, ok := c.(*tls.Conn); ok {
		raw = tc.NetConn()
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			c.Close()
			return
		}
		tc.SetDeadline(time.Time{})
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			br := bufio.NewReaderSize(c, 32<<10)
			c.SetReadDeadline(time.Now().Add(s.idle()))
			if p, err := br.Peek(len(h2Preface)); err != nil || string(p) != h2Preface {
				c.Close()
				return
			}
			br.Discard(len(h2Preface))
			s.serveH2(c, raw, br, "HTTP/2.0")
			return
		}
	}
	br := bufio.NewReaderSize(c, 32<<10)
	c.SetReadDeadline(time.Now().Add(s.idle()))
	if p, err := br.Peek(3); err == nil && string(p) == "PRI" {
		p, err := br.Peek(len(h2Preface))
		if err != nil || string(p) != h2Preface {
			c.Close()
			return
		}
		br.Discard(len(h2Preface))
		s.serveH2(c, raw, br, "HTTP/2.0")
		return
	}
	s.serveH1(c, raw, br)
}

// reset closes the connection with a TCP RST (SO_LINGER 0): raw is the TCP
// connection under c (c itself when not TLS).
func reset(c, raw net.Conn) {
	if tc, ok := raw.(*net.TCPConn); ok {
		tc.SetLinger(0)
		tc.Close()
	}
	c.Close()
}

// Refuser holds a loopback port on which every connect is refused: the
// port is bound (so that nobody else gets it) but never listens.
type Refuser struct {
	fd   int
	Addr *net.TCPAddr
}

// Refusing binds a TCP socket on ip (127.0.0.1 or ::1) without listening.
func Refusing(ip net.IP) (*Refuser, error) {
	family := syscall.AF_INET
	if ip.To4() == nil {
		family = syscall.AF_INET6
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var sa syscall.Sockaddr
	if family == syscall.AF_INET {
		a := &syscall.SockaddrInet4{}
		copy(a.Addr[:], ip.To4())
		sa = a
	} else {
		a := &syscall.SockaddrInet6{}
		copy(a.Addr[:], ip.To16())
		sa = a
	}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	got, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return nil, err
	}
	r := &Refuser{fd: fd}
	switch a := got.(type) {
	case *syscall.SockaddrInet4:
		r.Addr = &net.TCPAddr{IP: net.IP(a.Addr[:]).To16(), Port: a.Port}
	case *syscall.SockaddrInet6:
		r.Addr = &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	default:
		syscall.Close(fd)
		return nil, fmt.Errorf("ledger: unexpected socket address %T", got)
	}
	return r, nil
}

// Close releases the port.
func (r *Refuser) Close() error { return syscall.Close(r.fd) }
