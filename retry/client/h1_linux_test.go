package client

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

// TestH1WriteInFlightKeepsTheConnection: an upstream answers before it has
// read the last piece of a body streamed beside the response's read, whose
// write then waits in the kernel (small socket buffers both ways). The
// response's end does not wait for that write: it leaves the connection to
// it, and the write puts it back in the pool once the upstream has read
// the rest, so that the next request goes out on the same connection.
func TestH1WriteInFlightKeepsTheConnection(t *testing.T) {
	const size, rest = 256 << 10, 16 << 10 // the last piece is rest bytes
	small := func(opt int) func(network, address string, c syscall.RawConn) error {
		return func(network, address string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, opt, 2048) })
			if err != nil {
				return err
			}
			return serr
		}
	}
	// The receive buffer is set before listen, so that accepted
	// connections advertise a small window from the start.
	lc := net.ListenConfig{Control: small(syscall.SO_RCVBUF)}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns atomic.Int64
	readRest := make(chan struct{})

	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := conns.Add(1)
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if n > 1 {
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					return
				}
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				// All but the last piece and its first byte (the client
				// read its source to the end before it began to write the
				// last piece), then the answer, while the rest of the
				// last piece waits in the client's write.
				if _, err := io.ReadFull(req.Body, make([]byte, size-rest+1)); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				<-readRest
				if _, err := io.Copy(io.Discard, req.Body); err != nil {
					return
				}
				if _, _, err := rawtest.ReadReq(br); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}()
		}
	}()
	d := net.Dialer{Control: small(syscall.SO_SNDBUF)}
	base := NewHTTPTransport(HTTPOptions{
		// One connection: the second request waits for it to come back to
		// the pool (or to be closed).
		MaxConnsPerHost: 1,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	})
	defer base.CloseIdleConnections()
	url := "http://" + ln.Addr().String() + "/"
	// A body of known length that is not in memory: streamed beside the
	// response's read, in pieces of 16 KiB.
	body := &eofSeen{r: io.MultiReader(strings.NewReader(strings.Repeat("b", size)))}
	req, _ := http.NewRequest("PUT", url, nil)
	req.Body, req.ContentLength = body, size
	roundTripBody(t, base, req)
	close(readRest)
	roundTripBody(t, base, rawtest.Get(t, url))
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want the first one reused", n)
	}
}
