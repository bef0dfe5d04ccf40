package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os"
	"time"
)

// Protocol is what the first bytes of a transparent connection look like.
type Protocol string

// Protocols told apart by sniff. Only ProtoHTTP1 is proxied; every other
// one is passed through byte for byte and counted under its name.
const (
	ProtoHTTP1    Protocol = "http1"
	ProtoTLS      Protocol = "tls"
	ProtoHTTP2    Protocol = "http2"
	ProtoPostgres Protocol = "postgres"
	ProtoRedis    Protocol = "redis"
	ProtoSilent   Protocol = "server_first" // the destination spoke first, or nobody did
	ProtoUnknown  Protocol = "unknown"
	ProtoUpgrade  Protocol = "upgrade" // an HTTP/1.1 Upgrade (e.g. WebSocket)
	// ProtoForwardProxy: a CONNECT or absolute-form request in transparent
	// mode, to the pod's own forward proxy.
	ProtoForwardProxy Protocol = "forward_proxy"
)

// sniffLen is how many bytes are enough to tell HTTP/1.x from the rest: the
// longest method we accept and a space.
const sniffLen = 16

// h2Preface is the first line of the HTTP/2 client preface: enough to tell
// it apart (serveH2 waits for the rest).
var h2Preface = []byte(h2FullPreface[:len("PRI * HTTP/2.0\r\n")])

// sniff peeks at the first bytes the client sent on c, waiting at most
// timeout for them, without consuming anything from br. A read error other
// than the timeout is returned (the client went away).
func sniff(c net.Conn, br *bufio.Reader, timeout time.Duration) (Protocol, error) {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return ProtoUnknown, err
	}
	defer c.SetReadDeadline(time.Time{})
	p, err := sniffBuffered(br)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if br.Buffered() == 0 {
			return ProtoSilent, nil
		}
		return ProtoUnknown, nil
	}
	return p, err
}

// sniffBuffered peeks at br until classify decides or a read fails; the
// bytes stay in br. On a failure it returns the error, whatever came.
func sniffBuffered(br *bufio.Reader) (Protocol, error) {
	for want := 1; ; want = br.Buffered() + 1 {
		_, err := br.Peek(want)
		b, _ := br.Peek(br.Buffered())
		if p, ok := classify(b); ok {
			return p, nil
		}
		if err != nil {
			return ProtoUnknown, err
		}
	}
}

// classify decides from the bytes seen so far; ok is false when more bytes
// are needed, never with sniffLen bytes or more.
func classify(b []byte) (Protocol, bool) {
	if len(b) == 0 {
		return "", false
	}
	switch b[0] {
	case 0x16: // TLS handshake record
		return ProtoTLS, true
	case '*': // RESP array, what a Redis client sends first
		return ProtoRedis, true
	}
	if len(b) >= 8 && b[0] == 0 && (pgCode(b) == 80877103 || pgCode(b) == 196608 || pgCode(b) == 80877104) {
		return ProtoPostgres, true // SSLRequest, StartupMessage 3.0, GSSENCRequest
	}
	n := min(len(b), len(h2Preface))
	if bytes.Equal(b[:n], h2Preface[:n]) {
		if n == len(h2Preface) {
			return ProtoHTTP2, true
		}
		return "", false // "PRI" could still be a method; wait
	}
	// HTTP/1.x: a method token of upper-case letters, then a space.
	for i, c := range b {
		switch {
		case c == ' ' && i > 0:
			return ProtoHTTP1, true
		case c >= 'A' && c <= 'Z', c == '-' || c == '_':
			if i >= sniffLen-1 {
				return ProtoUnknown, true
			}
			continue
		}
		return ProtoUnknown, true
	}
	return "", false
}

func pgCode(b []byte) uint32 {
	return uint32(b[4])<<24 | uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
}
