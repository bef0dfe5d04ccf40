package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"

	"github.com/egret-proxy/egret/internal/h1"
)

// parseHeadStd is the reference for parseHead: the same checks over
// net/http.ReadRequest (what parseHead did before it parsed heads itself),
// with the error's status taken from the start of net/http's message.
func parseHeadStd(head []byte) (*http.Request, error) {
	var hasCL, hasTE bool
	_, fields, _ := bytes.Cut(head, []byte("\n"))
	for len(fields) > 0 {
		var l []byte
		l, fields, _ = bytes.Cut(fields, []byte("\n"))
		name, _, ok := bytes.Cut(l, []byte(":"))
		if !ok {
			continue
		}
		switch {
		case asciiLowerIs(name, "content-length"):
			hasCL = true
		case asciiLowerIs(name, "transfer-encoding"):
			hasTE = true
		}
	}
	if hasCL && hasTE {
		return nil, h1.ErrLengthAndChunked
	}
	// The proxy refuses obsolete line folding, which net/http joins;
	// net/http cuts the request line first (at single spaces), so a bad
	// version there is still its 505.
	if line, fields, _ := bytes.Cut(head, []byte("\n")); obsFold(fields) {
		_, rest, _ := bytes.Cut(bytes.TrimSuffix(line, []byte("\r")), []byte(" "))
		_, proto, ok := bytes.Cut(rest, []byte(" "))
		if _, _, vok := http.ParseHTTPVersion(string(proto)); !ok || vok {
			return nil, fmt.Errorf("%w: obsolete line folding", h1.ErrMalformed)
		}
	}
	// The proxy refuses the asterisk form but for OPTIONS (RFC 9112
	// section 3.2.4), which net/http takes with any method.
	if line, _, _ := bytes.Cut(head, []byte("\n")); true {
		parts := strings.Split(strings.TrimSuffix(string(line), "\r"), " ")
		if major, _, vok := http.ParseHTTPVersion(parts[len(parts)-1]); len(parts) == 3 && vok && major == 1 && parts[1] == "*" && parts[0] != http.MethodOptions {
			return nil, fmt.Errorf("%w: request target * is only for OPTIONS", h1.ErrMalformed)
		}
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		if strings.HasPrefix(err.Error(), "unsupported transfer encoding") {
			return nil, fmt.Errorf("%w: %v", h1.ErrUnsupportedCoding, err)
		}
		if strings.HasPrefix(err.Error(), "malformed HTTP version") {
			return nil, fmt.Errorf("%w: %v", h1.ErrUnsupportedVersion, err)
		}
		return nil, fmt.Errorf("%w: %v", h1.ErrMalformed, err)
	}
	for k, vs := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, fmt.Errorf("%w: header field name %q", h1.ErrMalformed, k)
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, fmt.Errorf("%w: value of header field %q", h1.ErrMalformed, k)
			}
		}
	}
	if req.ProtoMajor != 1 {
		return nil, fmt.Errorf("%w: %s", h1.ErrUnsupportedVersion, req.Proto)
	}
	if hasTE && !(len(req.TransferEncoding) == 1 && req.TransferEncoding[0] == "chunked") {
		return nil, fmt.Errorf("%w: %q", h1.ErrUnsupportedCoding, req.TransferEncoding)
	}
	if e := req.Header.Get("Expect"); e != "" && !strings.EqualFold(e, "100-continue") {
		return nil, fmt.Errorf("%w: %q", h1.ErrExpectation, e)
	}
	return req, nil
}

// compareParse parses raw (read by readHead first, as the proxy does) with
// parseHead and with the reference, and reports any difference in the
// status answered or in the request made. It returns parseHead's status
// (200 for a request taken), or 0 when readHead refused raw.
func compareParse(t *testing.T, raw string) int {
	t.Helper()
	head, err := readHead(bufio.NewReader(strings.NewReader(raw)), nil, headLimits{maxBytes: DefaultMaxHeaderBytes, maxCount: DefaultMaxHeaderCount})
	if err != nil {
		return 0
	}
	got, _, gerr := parseHead(bytes.Clone(head))
	want, werr := parseHeadStd(bytes.Clone(head))
	status := func(err error) int {
		if err == nil {
			return 200
		}
		return statusOf(err)
	}
	if gs, ws := status(gerr), status(werr); gs != ws {
		t.Errorf("%q: status %d (%v), net/http's %d (%v)", raw, gs, gerr, ws, werr)
		return gs
	}
	if gerr != nil {
		return status(gerr)
	}
	// The field order (parseHead's second result) is the proxy's alone
	// (checked in TestHeaderOrderAndCaseKept).
	// net/http adds Cache-Control: no-cache to a Pragma: no-cache request;
	// the proxy forwards what it was sent.
	if _, ok := got.Header["Cache-Control"]; !ok && want.Header.Get("Pragma") == "no-cache" {
		delete(want.Header, "Cache-Control")
	}
	type view struct {
		Method, URL, RequestURI, Proto, Host string
		Major, Minor                         int
		Close                                bool
		ContentLength                        int64
		TE                                   []string
		Header                               http.Header
	}
	v := func(r *http.Request) view {
		return view{r.Method, r.URL.String(), r.RequestURI, r.Proto, r.Host, r.ProtoMajor, r.ProtoMinor,
			r.Close, r.ContentLength, r.TransferEncoding, r.Header}
	}
	if g, w := v(got), v(want); !reflect.DeepEqual(g, w) {
		t.Errorf("%q:\n got %+v\nwant %+v", raw, g, w)
	}
	if got.URL.Scheme != want.URL.Scheme || got.URL.Host != want.URL.Host || got.URL.Path != want.URL.Path ||
		got.URL.RawPath != want.URL.RawPath || got.URL.RawQuery != want.URL.RawQuery {
		t.Errorf("%q: URL %#v, want %#v", raw, got.URL, want.URL)
	}
	return 200
}

// headCases are request heads at the edges of what the proxy takes; the
// status is what parseHead answers (200: taken).
var headCases = []struct {
	name, raw string
	status    int
}{
	{"absolute form", "GET http://example.com:8080/a/b?q=1 HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: t\r\nAccept: */*\r\n\r\n", 200},
	{"origin form", "GET /a%20b?x=%zz HTTP/1.1\r\nHost: h\r\n\r\n", 200},
	{"asterisk", "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", 200},
	{"asterisk but for OPTIONS", "GET * HTTP/1.1\r\nHost: h\r\n\r\n", 400},
	{"asterisk, POST", "POST * HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\n", 400},
	{"absolute form wins over Host", "GET http://a.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n", 200},
	{"no Host", "GET /x HTTP/1.1\r\n\r\n", 200},
	{"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
	{"bare LF", "GET / HTTP/1.1\nHost: h\nX-A: 1\n\n", 200},
	{"lower case names", "GET / HTTP/1.1\r\nhost: h\r\ncontent-type: text/plain\r\nx-custom-thing: 1\r\nCONTENT-LENGTH: 0\r\n\r\n", 200},
	{"odd names", "GET / HTTP/1.1\r\nx_y: 1\r\nA-b-C: 2\r\n-x: 3\r\nx--y: 4\r\n" + strings.Repeat("long-", 20) + "x: 5\r\n\r\n", 200},
	{"repeated names", "GET / HTTP/1.1\r\nAccept: a\r\naccept: b\r\nX: 1\r\nX: 2\r\nX: 3\r\n\r\n", 200},
	{"value white space", "GET / HTTP/1.1\r\nX-A:   a b  \t\r\nX-B:\tb\r\nX-C:\r\nX-D: \r\n\r\n", 200},
	{"obs-text value", "GET / HTTP/1.1\r\nX-A: caf\xc3\xa9\r\n\r\n", 200},
	{"obs-fold", "GET / HTTP/1.1\r\nX-A: a\r\n  b\r\n\tc \r\nX-B: d\r\n\r\n", 400},           // refused, where net/http joins
	{"obs-fold blank continuation", "GET / HTTP/1.1\r\nX-A: a\r\n \r\nX-B: d\r\n\r\n", 400},  // refused, where net/http joins
	{"obs-fold of the last field", "GET / HTTP/1.1\r\nHost: h\r\nX-A: a\r\n b\r\n\r\n", 400}, // refused, where net/http joins
	{"obs-fold after a bad version", "GET / HTTP/1.1 \r\nX-A: a\r\n b\r\n\r\n", 505},         // net/http reads the request line first
	{"white space before the first field", "GET / HTTP/1.1\r\n X-A: a\r\n\r\n", 400},
	{"no colon", "GET / HTTP/1.1\r\nX-A a\r\n\r\n", 400},
	{"empty name", "GET / HTTP/1.1\r\n: a\r\n\r\n", 400},
	{"space in name", "GET / HTTP/1.1\r\nBad Name: 1\r\n\r\n", 400},
	{"space before colon", "GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400},
	{"space in name, then a bad coding", "POST / HTTP/1.1\r\nBad Name: 1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
	{"separator in name", "GET / HTTP/1.1\r\nX(A): 1\r\n\r\n", 400},
	{"NUL in value", "GET / HTTP/1.1\r\nX-A: a\x00b\r\n\r\n", 400},
	{"DEL in value", "GET / HTTP/1.1\r\nX-A: a\x7fb\r\n\r\n", 400},
	{"CR in value", "GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n", 400},
	{"CR at the end of a value", "GET / HTTP/1.1\r\nX-A: ab\r\r\n\r\n", 400},
	{"CR CR LF end", "GET / HTTP/1.1\r\nX-A: a\r\n\r\r\n", 400},
	{"two parts", "GET /\r\n\r\n", 400},
	{"double space", "GET  / HTTP/1.1\r\n\r\n", 505},
	{"trailing space", "GET / HTTP/1.1 \r\n\r\n", 505},
	{"bad method", "G@T / HTTP/1.1\r\n\r\n", 400},
	{"extension method", "PURGE / HTTP/1.1\r\n\r\n", 200},
	{"control in target", "GET /a\x01b HTTP/1.1\r\n\r\n", 400},
	{"space-free garbage target", "GET %zz HTTP/1.1\r\n\r\n", 400},
	{"bad port", "GET http://h:x/ HTTP/1.1\r\n\r\n", 400},
	{"HTTP/1.0", "GET / HTTP/1.0\r\n\r\n", 200},
	{"HTTP/1.0 keep-alive", "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", 200},
	{"HTTP/1.1 close", "GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n", 200},
	{"HTTP/1.2", "GET / HTTP/1.2\r\n\r\n", 200},
	{"HTTP/2.0", "GET / HTTP/2.0\r\n\r\n", 505},
	{"HTTP/0.9", "GET / HTTP/0.9\r\n\r\n", 505},
	{"HTTP/1.10", "GET / HTTP/1.10\r\n\r\n", 505},
	{"lower case version", "GET / http/1.1\r\n\r\n", 505},
	{"PRI", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505},
	{"HTTP/2.0 with a bad field", "GET / HTTP/2.0\r\nX-A a\r\n\r\n", 400},
	{"Content-Length", "POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n", 200},
	{"Content-Length leading zeros", "POST / HTTP/1.1\r\nContent-Length: 007\r\n\r\n", 200},
	{"same Content-Length twice", "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length:  5 \r\n\r\n", 200},
	{"different Content-Lengths", "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400},
	{"Content-Length list", "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", 400},
	{"signed Content-Length", "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", 400},
	{"negative Content-Length", "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
	{"hex Content-Length", "POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", 400},
	{"empty Content-Length", "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n", 400},
	{"huge Content-Length", "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 400},
	{"chunked", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 200},
	{"Chunked", "POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n", 200},
	{"chunked and gzip", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
	{"gzip", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
	{"two Transfer-Encodings", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
	{"chunked in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 501},
	{"CL and TE", "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
	{"CL and TE before a bad version", "POST / HTTP/9.9\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n", 400},
	{"Trailer announced", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum, X-B\r\n\r\n", 200},
	{"Trailer of Content-Length", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTrailer: x-a, content-length\r\n\r\n", 400},
	{"Trailer without chunked", "POST / HTTP/1.1\r\nTrailer: Content-Length\r\nContent-Length: 1\r\n\r\n", 200},
	{"Expect 100-continue", "PUT / HTTP/1.1\r\nContent-Length: 1\r\nExpect: 100-Continue\r\n\r\n", 200},
	{"Expect other", "PUT / HTTP/1.1\r\nExpect: 200-ok\r\n\r\n", 417},
	{"CONNECT authority", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 200},
	{"CONNECT path", "CONNECT /rpc HTTP/1.1\r\n\r\n", 200},
	{"CONNECT bad authority", "CONNECT exa mple HTTP/1.1\r\n\r\n", 505},
	{"Pragma", "GET / HTTP/1.1\r\nPragma: no-cache\r\n\r\n", 200},
	{"error text that quotes a status rule", "GET / HTTP/1.1\r\nmalformed HTTP version\r\n\r\n", 400},
	{"IPv6 host", "GET http://[::1]:8080/ HTTP/1.1\r\n\r\n", 200},
}

// obsFold reports whether a field line of fields (after the first)
// starts with white space.
func obsFold(fields []byte) bool {
	for i := 0; len(fields) > 0; i++ {
		var l []byte
		l, fields, _ = bytes.Cut(fields, []byte("\n"))
		if len(bytes.TrimRight(l, "\r")) == 0 {
			return false
		}
		if i > 0 && (l[0] == ' ' || l[0] == '\t') {
			return true
		}
	}
	return false
}

func TestParseHeadMatchesNetHTTP(t *testing.T) {
	for _, c := range headCases {
		if got := compareParse(t, c.raw); got != c.status {
			t.Errorf("%s: status %d, want %d", c.name, got, c.status)
		}
	}
}

func TestParseHeadDetails(t *testing.T) {
	if _, _, err := parseHead([]byte("GET http://h/ HTTP/1.1\r\nx-a: a\r\n  b\r\n\r\n")); !errors.Is(err, h1.ErrMalformed) || statusOf(err) != http.StatusBadRequest {
		t.Errorf("folded field: %v, want %v (400)", err, h1.ErrMalformed)
	}
	req, _, err := parseHead([]byte("GET http://h/ HTTP/1.1\r\nx-a: a b\r\nPragma: no-cache\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := req.Header["X-A"]; !slices.Equal(got, []string{"a b"}) {
		t.Errorf("folded field: %q, want [\"a b\"]", got)
	}
	if _, ok := req.Header["Cache-Control"]; ok {
		t.Errorf("Cache-Control added to a Pragma: no-cache request")
	}
	if got := req.Header["Content-Length"]; !slices.Equal(got, []string{"5"}) || req.ContentLength != 5 {
		t.Errorf("Content-Length %q (%d), want one 5", got, req.ContentLength)
	}
	if req.Body != http.NoBody {
		t.Errorf("Body %v, want http.NoBody", req.Body)
	}
	// Appending to one field's values never overwrites another's.
	req.Header["X-A"] = append(req.Header["X-A"], "more")
	if got := req.Header.Get("Pragma"); got != "no-cache" {
		t.Errorf("Pragma %q after an append to X-A", got)
	}
	for _, k := range slices.Sorted(maps.Keys(req.Header)) {
		if k != http.CanonicalHeaderKey(k) {
			t.Errorf("key %q not canonical", k)
		}
	}
}

func TestParseHeadErrors(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want error
	}{
		{"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", h1.ErrLengthAndChunked},
		{"GET / HTTP/3\r\n\r\n", h1.ErrUnsupportedVersion},
		{"POST / HTTP/1.1\r\nTransfer-Encoding: br\r\n\r\n", h1.ErrUnsupportedCoding},
		{"GET / HTTP/1.1\r\nExpect: x\r\n\r\n", h1.ErrExpectation},
		{"GET / HTTP/1.1\r\nX\r\n\r\n", h1.ErrMalformed},
	} {
		if _, _, err := parseHead([]byte(c.raw)); !errors.Is(err, c.want) {
			t.Errorf("%q: %v, want %v", c.raw, err, c.want)
		}
	}
}

// FuzzParseHead compares parseHead with net/http on any head readHead
// takes.
func FuzzParseHead(f *testing.F) {
	for _, c := range headCases {
		f.Add(c.raw)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		compareParse(t, raw)
	})
}

func BenchmarkParseHead(b *testing.B) {
	head := []byte("GET http://upstream.example:8080/path?q=1 HTTP/1.1\r\nHost: upstream.example:8080\r\n" +
		"User-Agent: curl/8.5.0\r\nAccept: */*\r\nX-Request-Id: 3f2a\r\nConnection: keep-alive\r\n\r\n")
	b.Run("own", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, _, err := parseHead(head); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("net-http", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := parseHeadStd(head); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestHeaderOrderAndCaseKept: 20 identical GETs with header fields in a
// distinctive order and case reach a raw TCP upstream with the client's
// fields first, in its order and case, hop-by-hop fields left out, and the
// proxy's own fields after them, the same way every time.
func TestHeaderOrderAndCaseKept(t *testing.T) {
	addr, heads := rawUpstream(t, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	p := startProxy(t, Config{})
	sent := []string{
		"zeta-last: 1",
		"X-Custom-ONE: a",
		"accept: */*",
		"x-custom-one: b",
		"User-agent: order-test",
		"aLpHa: 2",
		"Cookie: c=1",
	}
	hop := []string{"Connection: keep-alive, X-Drop", "X-Drop: gone", "Proxy-Authorization: Basic eA==", "keep-alive: 5"}
	var raw strings.Builder
	raw.WriteString("GET http://" + addr + "/p HTTP/1.1\r\nHost: " + addr + "\r\n")
	for i, f := range sent {
		raw.WriteString(f + "\r\n")
		if i < len(hop) {
			raw.WriteString(hop[i] + "\r\n")
		}
	}
	raw.WriteString("\r\n")

	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	br := bufio.NewReader(c)
	var first []string
	for i := range 20 {
		if _, err := io.WriteString(c, raw.String()); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %s", i, resp.Status)
		}
		head := <-heads
		lines := strings.Split(strings.TrimSuffix(head, "\r\n\r\n"), "\r\n")[2:] // after the request line and Host
		if len(lines) < len(sent) || !slices.Equal(lines[:len(sent)], sent) {
			t.Fatalf("request %d: upstream got fields\n%s\nwant first\n%s", i, strings.Join(lines, "\n"), strings.Join(sent, "\n"))
		}
		for j, l := range lines {
			if k, _, _ := strings.Cut(l, ":"); strings.EqualFold(k, HeaderRequestID) {
				lines[j] = k + ": (id)"
			}
			for _, h := range hop {
				if k, _, _ := strings.Cut(h, ":"); strings.HasPrefix(strings.ToLower(l), strings.ToLower(k)+":") {
					t.Errorf("request %d: hop-by-hop field went upstream: %q", i, l)
				}
			}
		}
		if first == nil {
			first = lines
		} else if !slices.Equal(lines, first) {
			t.Errorf("request %d: fields\n%s\nthe first request's\n%s", i, strings.Join(lines, "\n"), strings.Join(first, "\n"))
		}
	}
}

// rawUpstream is an upstream on a raw TCP listener: it sends each request
// head it reads, as it came, on heads and answers it with reply.
func rawUpstream(t *testing.T, reply string) (addr string, heads chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	heads = make(chan string, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					var head strings.Builder
					for {
						l, err := br.ReadString('\n')
						if err != nil {
							return
						}
						head.WriteString(l)
						if l == "\r\n" {
							break
						}
					}
					heads <- head.String()
					if _, err := io.WriteString(c, reply); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), heads
}

// TestObsFoldRefusedBothWays: a folded field line is refused in a request
// (400, nothing sent upstream) and in a response (a bad upstream response:
// 502, never relayed).
func TestObsFoldRefusedBothWays(t *testing.T) {
	addr, heads := rawUpstream(t, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	p := startProxy(t, Config{})
	resp := rawRequest(t, p.addr, "GET http://"+addr+"/folded HTTP/1.1\r\nHost: "+addr+"\r\nX-A: a\r\n b\r\n\r\n")
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("folded request: %s, want 400", resp.Status)
	}
	resp = rawRequest(t, p.addr, "GET http://"+addr+"/plain HTTP/1.1\r\nHost: "+addr+"\r\nX-A: a b\r\n\r\n")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("plain request: %s, want 200", resp.Status)
	}
	if head := <-heads; !strings.HasPrefix(head, "GET /plain ") {
		t.Errorf("the upstream's first request was %q, want the plain one", firstLine(head))
	}

	foldAddr, foldHeads := rawUpstream(t, "HTTP/1.1 200 OK\r\nX-Fold: a\r\n\tb\r\nContent-Length: 0\r\n\r\n")
	resp = rawRequest(t, p.addr, "GET http://"+foldAddr+"/ HTTP/1.1\r\nHost: "+foldAddr+"\r\n\r\n")
	<-foldHeads
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Fold") != "" {
		t.Errorf("folded response: %s X-Fold %q, want 502 and no X-Fold", resp.Status, resp.Header.Get("X-Fold"))
	}
	if got := resp.Header.Get(HeaderOutcome); got != "failed" {
		t.Errorf("folded response: %s %q, want failed", HeaderOutcome, got)
	}
}
