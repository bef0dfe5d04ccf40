// Command relay is a baseline for test/bench, not a proxy: the least a
// goroutine-per-connection Go program does to carry keep-alive HTTP/1.1
// requests to one upstream. Each client connection gets its own upstream
// connection; a request head (and a Content-Length body) is copied up, the
// response head and its Content-Length body copied back. No header is
// parsed beyond the framing, nothing is retried, logged, counted or
// checked: requests with other framing end the connection.
//
//	relay LISTEN UPSTREAM
//
// The bench measures its CPU per request beside egret's and HAProxy's, so
// that egret's cost can be told apart from the cost of Go's runtime and
// network stack on the same machine.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: relay LISTEN UPSTREAM")
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "relay:", err)
			os.Exit(1)
		}
		go serve(c, os.Args[2])
	}
}

func serve(c net.Conn, upstream string) {
	defer c.Close()
	u, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer u.Close()
	cr, ur := bufio.NewReader(c), bufio.NewReader(u)
	buf := make([]byte, 0, 8192)
	for {
		var ok bool
		if buf, ok = message(cr, buf[:0]); !ok {
			return
		}
		if _, err := u.Write(buf); err != nil {
			return
		}
		if buf, ok = message(ur, buf[:0]); !ok {
			return
		}
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

var contentLength = []byte("content-length:")

// message appends one message (head and Content-Length body) read from r.
func message(r *bufio.Reader, buf []byte) ([]byte, bool) {
	n := 0
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return buf, false
		}
		buf = append(buf, line...)
		if len(line) <= 2 {
			break
		}
		if len(line) > len(contentLength) && bytes.EqualFold(line[:len(contentLength)], contentLength) {
			if n, err = strconv.Atoi(string(bytes.TrimSpace(line[len(contentLength):]))); err != nil {
				return buf, false
			}
		}
	}
	head := len(buf)
	buf = append(buf, make([]byte, n)...)
	_, err := io.ReadFull(r, buf[head:])
	return buf, err == nil
}
