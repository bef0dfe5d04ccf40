package client

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// parsed is what a response parser made of a raw response.
type parsed struct {
	status, proto string
	code          int
	header        http.Header
	length        int64
	te            []string
	close         bool
	body          string
	bodyErr       bool
	rest          string // what is left on the connection after the body
}

func parseWith(read func(*bufio.Reader, *http.Request) (*http.Response, error), raw, method string) (parsed, error) {
	br := bufio.NewReaderSize(strings.NewReader(raw), 64) // small: lines longer than the buffer
	req, _ := http.NewRequest(method, "http://x/", nil)
	resp, err := read(br, req)
	if err != nil {
		return parsed{}, err
	}
	p := parsed{status: resp.Status, proto: resp.Proto, code: resp.StatusCode, header: resp.Header,
		length: resp.ContentLength, te: resp.TransferEncoding, close: resp.Close}
	b, err := io.ReadAll(resp.Body)
	p.body, p.bodyErr = string(b), err != nil
	if !p.bodyErr && !p.close {
		rest, _ := io.ReadAll(br)
		p.rest = string(rest)
	}
	if len(p.header) == 0 {
		p.header = nil
	}
	return p, nil
}

// compare checks readResponse against net/http.ReadResponse on raw: when
// ours accepts, net/http must accept it alike; strict says ours must also
// accept whatever net/http accepts.
func compare(raw, method string, strict bool) error {
	ours, oerr := parseWith(func(br *bufio.Reader, req *http.Request) (*http.Response, error) {
		return readResponse(br, req, nil)
	}, raw, method)
	theirs, terr := parseWith(http.ReadResponse, raw, method)
	switch {
	case oerr != nil && terr != nil:
		return nil
	case oerr != nil:
		if strict {
			return fmt.Errorf("refused what net/http takes: %v (net/http: %+v)", oerr, theirs)
		}
		return nil
	case terr != nil:
		return fmt.Errorf("took what net/http refuses (%v): %+v", terr, ours)
	}
	if !ours.bodyErr && theirs.bodyErr {
		// A chunked body's trailer section ends at its first empty line,
		// ended by a bare LF too, where net/http waits for a CRLF CRLF
		// (internal/h1, issue 22): once one follows, it must read the same.
		if t, err := parseWith(http.ReadResponse, raw+"\r\n\r\n", method); err == nil && !t.bodyErr {
			t.rest = strings.TrimSuffix(t.rest, "\r\n\r\n")
			theirs = t
		}
	}
	if theirs.bodyErr != ours.bodyErr || (!ours.bodyErr && ours.body != theirs.body) {
		return fmt.Errorf("body %q (error %v), net/http %q (error %v)", ours.body, ours.bodyErr, theirs.body, theirs.bodyErr)
	}
	ours.body, theirs.body = "", ""
	if !reflect.DeepEqual(ours, theirs) {
		return fmt.Errorf("\nours    %+v\nnet/http %+v", ours, theirs)
	}
	return nil
}

func TestReadResponseAsNetHTTP(t *testing.T) {
	long := strings.Repeat("v", 300)
	for _, tc := range []struct {
		raw    string
		method string
		refuse bool // ours refuses it (net/http may too)
	}{
		{raw: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\nx-lower: y\r\n\r\nhelloNEXT"},
		{raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;ext=1\r\nlo\r\n0\r\nTrailer-A: b\r\n\r\nNEXT"},
		{raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n1\r\nx\r\n0\r\n\r\n"},
		{raw: "HTTP/1.1 200 OK\r\n\r\nuntil close"},
		{raw: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"},
		{raw: "HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\nok"},
		{raw: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"},
		{raw: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nokNEXT"},
		{raw: "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n"},
		{raw: "HTTP/1.1 404 Not Found Here\r\nContent-Length: 1\r\n\r\nx"},
		{raw: "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nNEXT"},
		{raw: "HTTP/1.1 304 Not Modified\r\n\r\nNEXT"},
		{raw: "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\nNEXT"},
		{raw: "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nNEXT"},
		{raw: "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\nok"},
		{raw: "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nNEXT", method: "HEAD"},
		{raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nNEXT", method: "HEAD"},
		{raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"},
		{raw: "HTTP/1.1 200 OK\r\nX-Long: " + long + "\r\nContent-Length: 2\r\n\r\nok"},
		{raw: "HTTP/1.1 200 OK\nContent-Length: 2\n\nok"},
		{raw: "HTTP/1.1 200 OK\r\nX-Fold: a\r\n  b\r\nContent-Length: 0\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\nX-Sp:   padded  \r\nX-Empty:\r\nContent-Length: 0\r\n\r\n"},
		{raw: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"},
		{raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"},
		{raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\n: x\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\n X-Lead: x\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 2000 OK\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 abc OK\r\n\r\n", refuse: true},
		{raw: "HTTP/9.9 200 OK\r\n\r\n", refuse: true},
		{raw: "FTP/1.1 200 OK\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", refuse: true},
		{raw: "", refuse: true},
		// Where the response side once parted from net/http, before it
		// shared the request side's rules (internal/h1):
		{raw: "HTTP/1.0 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 2\r\n\r\nok"},
		{raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-A\r\n\r\n0\r\nX-A: 1\r\n\r\n"},
		{raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: Content-Length\r\n\r\n0\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\xc2\x85\r\n\r\nok", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: \xe2\x84\xaahunked\r\n\r\n0\r\n\r\n", refuse: true},
		{raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nA: 1\n\r\n\r\nNEXT"},
		{raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\n0\r\n\r\n"},
	} {
		if tc.method == "" {
			tc.method = "GET"
		}
		_, err := parseWith(func(br *bufio.Reader, req *http.Request) (*http.Response, error) {
			return readResponse(br, req, nil)
		}, tc.raw, tc.method)
		if (err != nil) != tc.refuse {
			t.Errorf("%q: error %v, want refused %v", tc.raw, err, tc.refuse)
			continue
		}
		if err := compare(tc.raw, tc.method, !tc.refuse); err != nil {
			t.Errorf("%q: %v", tc.raw, err)
		}
	}
}

// FuzzReadResponse: whatever readResponse accepts, net/http.ReadResponse
// accepts and reads the same way.
func FuzzReadResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n0\r\nT: x\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nbody",
		"HTTP/1.1 100 Continue\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-Fold: a\r\n\tb\r\nConnection: close\r\n\r\n",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, raw string, head bool) {
		method := "GET"
		if head {
			method = "HEAD"
		}
		if err := compare(raw, method, false); err != nil {
			t.Fatal(err)
		}
	})
}
