package client

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

// TestSwitchAnswers: which 101s answer which requests (RFC 9110 section
// 7.8).
func TestSwitchAnswers(t *testing.T) {
	req := func(proto, conn, upg string) *http.Request {
		r, _ := http.NewRequest("GET", "http://x/", nil)
		r.Proto, r.ProtoMajor, r.ProtoMinor = proto, 1, 1
		if proto == "HTTP/1.0" {
			r.ProtoMinor = 0
		}
		if conn != "" {
			r.Header.Set("Connection", conn)
		}
		if upg != "" {
			r.Header.Set("Upgrade", upg)
		}
		return r
	}
	resp := func(conn, upg string) http.Header {
		h := http.Header{}
		if conn != "" {
			h.Set("Connection", conn)
		}
		if upg != "" {
			h.Set("Upgrade", upg)
		}
		return h
	}
	for _, tc := range []struct {
		name string
		req  *http.Request
		h    http.Header
		ok   bool
	}{
		{"websocket", req("HTTP/1.1", "Upgrade", "websocket"), resp("Upgrade", "websocket"), true},
		{"case and lists", req("HTTP/1.1", "keep-alive, UPGRADE", "h2c, WebSocket/13"), resp("upgrade", "websocket"), true},
		{"version offered", req("HTTP/1.1", "Upgrade", "foo/2, bar"), resp("Upgrade", "foo/2"), true},
		{"version not offered", req("HTTP/1.1", "Upgrade", "foo/2"), resp("Upgrade", "foo/3"), false},
		{"not asked", req("HTTP/1.1", "", ""), resp("Upgrade", "websocket"), false},
		{"Upgrade not named by Connection", req("HTTP/1.1", "keep-alive", "websocket"), resp("Upgrade", "websocket"), false},
		{"HTTP/1.0", req("HTTP/1.0", "Upgrade", "websocket"), resp("Upgrade", "websocket"), false},
		{"another protocol", req("HTTP/1.1", "Upgrade", "websocket"), resp("Upgrade", "h2c"), false},
		{"no Upgrade", req("HTTP/1.1", "Upgrade", "websocket"), resp("Upgrade", ""), false},
		{"no Connection: upgrade", req("HTTP/1.1", "Upgrade", "websocket"), resp("", "websocket"), false},
		{"an empty protocol", req("HTTP/1.1", "Upgrade", "websocket"), resp("Upgrade", "websocket, "), false},
	} {
		err := switchAnswers(tc.req, tc.h)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, errMalformedResponse) {
			t.Errorf("%s: %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestUnaskedSwitchIsMalformed: a 101 to a request that asked for no
// switch is a malformed response from a real socket, never a connection
// handed over.
func TestUnaskedSwitchIsMalformed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\nraw")
	}()
	tr := NewHTTPTransport(HTTPOptions{})
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(rawtest.Get(t, "http://"+ln.Addr().String()+"/"))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %d, want an error", resp.StatusCode)
	}
	if !errors.Is(err, errMalformedResponse) {
		t.Fatalf("%v, want a malformed response", err)
	}
}
