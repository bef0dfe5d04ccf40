package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/egret-proxy/egret/retry/client"
)

// FuzzUpgrade runs a request head with any Upgrade and Connection fields
// (and any body) through egret's real server, followed on the connection
// by an innocent request, to an upstream that answers it with any bytes.
// A strict parser (net/http's) reads both what the client sent and what
// reached the upstream. It must hold that:
//   - the client gets a 101 only when its request asked to switch and
//     the upstream said 101 with an Upgrade field;
//   - until the client has a 101, every request the upstream reads is one
//     the client sent (method, path, body): nothing is smuggled by an
//     Upgrade, a Connection field or a reply.
//
// Its seeds (f.Add, and any in testdata/fuzz/FuzzUpgrade) run under plain
// go test.
func FuzzUpgrade(f *testing.F) {
	ws := "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	sw := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	ok := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	inner := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, s := range []struct {
		method, fields, body, reply string
		http10                      bool
	}{
		{"GET", ws, "", sw, false},
		{"GET", ws, "", ok, false},
		{"GET", "", "", sw, false},
		{"GET", ws, "", sw, true},
		{"GET", ws, "", "SSH-2.0-OpenSSH_9.2\r\n", false},
		{"GET", ws, "", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n", false},
		{"GET", "Connection: keep-alive, Upgrade\r\nUpgrade: WebSocket/13, h2c\r\n", "", sw, false},
		{"POST", "Connection: Upgrade, Content-Length\r\nUpgrade: foo\r\nContent-Length: 35\r\n", inner, ok, false},
		{"POST", "Connection: Upgrade, Transfer-Encoding\r\nUpgrade: foo\r\nTransfer-Encoding: chunked\r\n", "23\r\n" + inner + "\r\n0\r\n\r\n", sw, false},
		{"POST", "Connection: Upgrade\r\nUpgrade: foo\r\nContent-Length: 35\r\nTransfer-Encoding: chunked\r\n", inner, ok, false},
		{"GET", "Connection: Upgrade\r\nUpgrade: foo\r\n", "", "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\r\n" + inner, false},
		{"GET", "Connection: Upgrade\r\nUpgrade: foo\r\nExpect: 100-continue\r\nContent-Length: 1\r\n", "x", "HTTP/1.1 100 Continue\r\n\r\n" + sw, false},
	} {
		f.Add(s.method, s.fields, []byte(s.body), []byte(s.reply), s.http10)
	}
	f.Fuzz(func(t *testing.T, method, fields string, body, reply []byte, http10 bool) {
		if len(fields)+len(body)+len(reply) > 4096 || !upperToken(method) {
			// A method other than upper-case letters is not sniffed as
			// HTTP: the connection is passed through as it came, never
			// read as requests (not the path under test).
			return
		}
		up := newFuzzUpstream(t, reply)
		p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: mustAddrPort(t, up.ln.Addr().String())},
			Policy: mustPolicy(t, "defaults:\n  max_attempts: 1\n  timeout: 3s\n")})
		proto := "HTTP/1.1"
		if http10 {
			proto = "HTTP/1.0"
		}
		var sent bytes.Buffer
		sent.WriteString(method + " /first " + proto + "\r\nHost: ws.example\r\n" + fields + "\r\n")
		sent.Write(body)
		sent.WriteString("GET /next HTTP/1.1\r\nHost: ws.example\r\n\r\n")

		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write(sent.Bytes())
		switched := false
		br := bufio.NewReader(c)
		for range 2 {
			resp, err := http.ReadResponse(br, &http.Request{Method: method})
			if err != nil {
				break
			}
			if resp.StatusCode == http.StatusSwitchingProtocols {
				switched = true
				break
			}
			io.Copy(io.Discard, resp.Body)
			if resp.Close {
				break
			}
		}
		c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		p.Shutdown(ctx)
		cancel()
		got := up.finish()

		// What a strict parser reads in what the client sent.
		var want []string
		var first *http.Request
		rb := bufio.NewReader(bytes.NewReader(sent.Bytes()))
		for {
			r, err := http.ReadRequest(rb)
			if err != nil {
				break
			}
			b, err := io.ReadAll(r.Body)
			if err != nil {
				break
			}
			if first == nil {
				first = r
			}
			want = append(want, r.Method+" "+r.URL.Path+" "+string(b))
		}
		if switched {
			rrb := bufio.NewReader(bytes.NewReader(reply))
			rr, err := http.ReadResponse(rrb, nil)
			for err == nil && rr.StatusCode >= 100 && rr.StatusCode < 200 && rr.StatusCode != 101 {
				rr, err = http.ReadResponse(rrb, nil)
			}
			if first == nil || !client.AsksUpgrade(first) || err != nil || rr.StatusCode != 101 || rr.Header.Get("Upgrade") == "" {
				t.Fatalf("the client got a 101 to %q, the upstream having said %q", sent.String(), reply)
			}
			return // what follows went through the switch
		}
		for _, g := range got {
			found := false
			for _, w := range want {
				if g == w {
					found = true
				}
			}
			if !found {
				t.Fatalf("the upstream read %q, which the client never sent as a request (it sent %q; the strict parser reads %q)", g, sent.String(), want)
			}
		}
	})
}

// fuzzUpstream answers the first request on each connection with reply,
// the others with 200 and a close, and records every request it reads on
// every connection (also after its answer, until the connection ends).
type fuzzUpstream struct {
	ln    net.Listener
	reply []byte
	wg    sync.WaitGroup
	mu    sync.Mutex
	reqs  []string
}

func newFuzzUpstream(t *testing.T, reply []byte) *fuzzUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &fuzzUpstream{ln: ln, reply: reply}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.wg.Add(1)
			go u.serve(c)
		}
	}()
	t.Cleanup(func() { u.finish() })
	return u
}

func (u *fuzzUpstream) serve(c net.Conn) {
	defer u.wg.Done()
	defer c.Close()
	c.SetDeadline(time.Now().Add(4 * time.Second))
	br := bufio.NewReader(c)
	for n := 0; ; n++ {
		r, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		u.mu.Lock()
		u.reqs = append(u.reqs, r.Method+" "+r.URL.Path+" "+string(b))
		u.mu.Unlock()
		switch n {
		case 0:
			c.Write(u.reply)
			if !bytes.Contains(u.reply, []byte(" 101 ")) {
				c.(*net.TCPConn).CloseWrite() // a cut reply ends here
			}
		case 1:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			c.(*net.TCPConn).CloseWrite()
		}
	}
}

// finish closes the listener, waits for every connection to end and
// returns what was read.
func (u *fuzzUpstream) finish() []string {
	u.ln.Close()
	u.wg.Wait()
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.reqs...)
}

func upperToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return s != "" && len(s) <= 16
}
