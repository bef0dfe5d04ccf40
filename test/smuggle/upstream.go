package smuggle

import (
	"errors"
	"io"
	"net"
	"sync"

	"golang.org/x/sys/unix"
)

// Upstream is a strict HTTP/1.1 server on loopback that records every byte
// each connection brings. It answers each request its strict parser reads
// with 200 (never 101, and 405 to CONNECT: nothing here may become a raw
// pipe because the upstream agreed to it), and a refusal with 400 and a half-close; after a
// half-close it keeps reading, so that bytes sent after the end of what
// it could frame are recorded too.
type Upstream struct {
	ln    net.Listener
	mu    sync.Mutex
	cond  *sync.Cond
	conns []*upConn
	wg    sync.WaitGroup
}

type upConn struct {
	nc   *net.TCPConn
	buf  []byte
	done bool
}

// StartUpstream listens on 127.0.0.1 and serves until Finish.
func StartUpstream() (*Upstream, error) { return StartUpstreamOn("127.0.0.1:0") }

// StartUpstreamOn is StartUpstream on addr.
func StartUpstreamOn(addr string) (*Upstream, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	u := &Upstream{ln: ln}
	u.cond = sync.NewCond(&u.mu)
	u.wg.Add(1)
	go u.accept()
	return u, nil
}

// Addr is the address it listens on.
func (u *Upstream) Addr() string { return u.ln.Addr().String() }

func (u *Upstream) accept() {
	defer u.wg.Done()
	for {
		nc, err := u.ln.Accept()
		if err != nil {
			return
		}
		c := &upConn{nc: nc.(*net.TCPConn)}
		u.mu.Lock()
		u.conns = append(u.conns, c)
		u.mu.Unlock()
		u.wg.Add(1)
		go u.serve(c)
	}
}

const okAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

func (u *Upstream) serve(c *upConn) {
	defer u.wg.Done()
	var tmp [16 << 10]byte
	parsed, parsing := 0, true
	for {
		n, err := c.nc.Read(tmp[:])
		u.mu.Lock()
		c.buf = append(c.buf, tmp[:n]...)
		buf := c.buf
		if err != nil {
			c.done = true
		}
		u.cond.Broadcast()
		u.mu.Unlock()
		if err != nil {
			// The peer is done sending: so is a server.
			c.nc.CloseWrite()
			return
		}
		for parsing {
			r, m, perr := ParseRequest(buf[parsed:])
			if errors.Is(perr, ErrIncomplete) {
				break
			}
			if perr != nil {
				io.WriteString(c.nc, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
				c.nc.CloseWrite()
				parsing = false
				break
			}
			parsed += m
			answer := okAnswer
			if r.Method == "HEAD" {
				answer = okAnswer[:len(okAnswer)-2]
			}
			if r.Close {
				answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
			}
			if r.Method == "CONNECT" {
				// Nor a tunnel: a 2xx to CONNECT would make one.
				answer = "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n"
			}
			io.WriteString(c.nc, answer)
			if r.Close {
				c.nc.CloseWrite()
				parsing = false
			}
		}
	}
}

// received is what the kernel took in on c (TCP_INFO bytes_received).
func received(c *net.TCPConn) (uint64, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	var n uint64
	var ok bool
	rc.Control(func(fd uintptr) {
		ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err == nil {
			n, ok = ti.Bytes_received, true
		}
	})
	return n, ok
}

// Finish waits until every byte the kernel received on each connection has
// been read and recorded, closes everything and returns each connection's
// bytes in the order the connections were accepted.
func (u *Upstream) Finish() [][]byte {
	u.mu.Lock()
	for _, c := range u.conns {
		for !c.done {
			n, ok := received(c.nc)
			if !ok || uint64(len(c.buf)) >= n {
				break
			}
			u.cond.Wait()
		}
	}
	u.mu.Unlock()
	u.ln.Close()
	u.mu.Lock()
	for _, c := range u.conns {
		c.nc.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
	out := make([][]byte, len(u.conns))
	for i, c := range u.conns {
		out[i] = c.buf
	}
	return out
}
