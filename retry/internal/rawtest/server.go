// Package rawtest holds the raw-socket test helpers shared by the tests of
// retry and retry/client: loopback HTTP/1 and HTTP/2 servers written on bare
// connections, request builders and poll(2) waits. It is test-only: nothing
// but _test.go files may import it.
package rawtest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Server is a loopback TCP server whose connections are handled by fn
// (conn number from 1).
type Server struct {
	ln    net.Listener
	conns atomic.Int64
	wg    sync.WaitGroup
	mu    sync.Mutex
	open  []net.Conn
}

// NewServer starts a Server handling each connection with fn; it is closed,
// with every connection it accepted, when t ends.
func NewServer(t *testing.T, fn func(c net.Conn, n int)) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(s.conns.Add(1))
			s.mu.Lock()
			s.open = append(s.open, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				fn(c, n)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.open {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

// URL is the server's root URL.
func (s *Server) URL() string { return "http://" + s.Addr() + "/" }

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Conns is the number of connections the server has accepted.
func (s *Server) Conns() int64 { return s.conns.Load() }

// Conn is the server's side of the i-th connection it accepted (from 0).
func (s *Server) Conn(i int) net.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open[i]
}

// ReadReq reads one whole request (body included) from br.
func ReadReq(br *bufio.Reader) (*http.Request, []byte, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, err
	}
	b, err := io.ReadAll(req.Body)
	return req, b, err
}

// Reset closes c with RST.
func Reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// AnswerEach serves requests on each connection with answer(i), i counting
// the requests of that connection from 1; answer returns the raw response
// and whether to close the connection after it. seen counts the requests.
func AnswerEach(t *testing.T, seen *atomic.Int64, answer func(req *http.Request, i int) (string, bool)) *Server {
	return NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		for i := 1; ; i++ {
			req, _, err := ReadReq(br)
			if err != nil {
				return
			}
			seen.Add(1)
			raw, closeAfter := answer(req, i)
			io.WriteString(c, raw)
			if closeAfter {
				return
			}
		}
	})
}

// Get is a GET request for url.
func Get(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// Post is a POST request for url with body.
func Post(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}
