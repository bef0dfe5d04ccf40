package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/egret-proxy/egret/internal/h1"
)

// Errors of reading a client request are internal/h1's, the one set of
// HTTP/1 error values (*h1.Error wrapping a sentinel, matched with
// errors.Is); statusOf says the status each is answered with.

// headLimits bound the head of a client request.
type headLimits struct {
	maxBytes int // request line + header fields
	maxCount int // header fields
}

// statusOf is the status answered for an error of reading a request.
func statusOf(err error) int {
	switch {
	case errors.Is(err, h1.ErrHeadTooLarge), errors.Is(err, h1.ErrTooManyFields):
		return http.StatusRequestHeaderFieldsTooLarge
	case errors.Is(err, h1.ErrStartLineTooLong):
		return http.StatusRequestURITooLong
	case errors.Is(err, h1.ErrUnsupportedVersion): // h1.ErrBadVersion too
		return http.StatusHTTPVersionNotSupported
	case errors.Is(err, h1.ErrUnsupportedCoding):
		return http.StatusNotImplemented
	case errors.Is(err, h1.ErrExpectation):
		return http.StatusExpectationFailed
	}
	return http.StatusBadRequest
}

// badRequest is a request the proxy finds malformed beyond h1's rules.
func badRequest(format string, args ...any) error {
	return &h1.Error{Err: h1.ErrMalformed, Detail: fmt.Sprintf(format, args...)}
}

// readHead reads one request head (request line, header fields and the empty
// line) into buf and returns it (h1.ReadHead). Up to 4 empty lines before
// the request line are skipped (RFC 9112 section 2.2). It enforces the
// limits as it reads, so a client cannot make the proxy buffer more than
// maxBytes.
func readHead(br *bufio.Reader, buf []byte, lim headLimits) ([]byte, error) {
	if err := h1.SkipEmptyLines(br, 4); err != nil {
		return buf[:0], err
	}
	return h1.ReadHead(br, buf[:0], h1.Limits{MaxBytes: lim.maxBytes, MaxFields: lim.maxCount})
}

// parseHead parses a head read by readHead. The returned request has no
// body yet (see attachBody). Framing is checked here: Content-Length with
// Transfer-Encoding, an unsupported transfer coding and a version other than
// HTTP/1.x are refused.
//
// It accepts and refuses what net/http.ReadRequest does (a request line of
// three parts, a token method, an HTTP/X.Y version, a request target that
// url.ParseRequestURI takes, header lines with a colon, token names and
// values without control characters, no white space before the first
// field, one Host, one Transfer-Encoding, Content-Length values that agree)
// and answers with the same statuses, but it reads the head in one pass
// and makes every string of the request a part of one copy of the head
// (internal/h1 says why not net/textproto). Obsolete line folding is
// refused (net/http joins the lines). Unlike net/http it does not add
// Cache-Control: no-cache to a request with Pragma: no-cache: the proxy
// forwards the header it was sent.
//
// It returns the header field names as sent, one per field line, in the
// order sent: the order the fields go upstream in (retry.Exchange's
// FieldOrder).
func parseHead(head []byte) (*http.Request, []string, error) {
	req, order, err := parseRequest(head)
	// Content-Length with Transfer-Encoding is refused before anything
	// else is looked at: h1.Frame checks it once there are fields; when
	// parsing failed before, the field lines are looked for here.
	if err != nil && !errors.Is(err, h1.ErrLengthAndChunked) && lengthAndChunked(head) {
		return nil, nil, h1.ErrLengthAndChunked
	}
	return req, order, err
}

// lengthAndChunked reports whether head has both a Content-Length and a
// Transfer-Encoding field line.
func lengthAndChunked(head []byte) bool {
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
	return hasCL && hasTE
}

// parseRequest is parseHead but for the Content-Length with
// Transfer-Encoding rule. Its checks come in net/http's order, so that a
// head that breaks two rules gets the status of the first.
func parseRequest(head []byte) (*http.Request, []string, error) {
	s := string(head) // the one copy: methods, targets, names and values are parts of it
	line, rest := h1.CutLine(s)
	rl, err := h1.ParseRequestLine(line)
	if err != nil {
		return nil, nil, err
	}
	method, uri := rl.Method, rl.Target
	// The asterisk form names the server itself, only for OPTIONS (RFC
	// 9112 section 3.2.4): net/http takes "GET *", and an upstream that
	// reads it as a path and one that refuses it would disagree. (Another
	// version, the HTTP/2 preface's PRI * HTTP/2.0 too, is a 505 below.)
	if uri == "*" && method != http.MethodOptions && rl.Major == 1 {
		return nil, nil, badRequest("request target * is only for OPTIONS")
	}
	// CONNECT names an authority (host:port), or a path as net/rpc does.
	rawURL := uri
	authority := method == http.MethodConnect && !strings.HasPrefix(uri, "/")
	if authority {
		rawURL = "http://" + uri
	}
	u, err := url.ParseRequestURI(rawURL)
	if err != nil {
		return nil, nil, badRequest("%v", err)
	}
	if authority {
		u.Scheme = ""
	}

	h, order, badName, err := h1.ParseFields(rest, true)
	if err != nil {
		return nil, nil, err
	}
	_, hasTE := h["Transfer-Encoding"]
	if _, hasCL := h["Content-Length"]; hasCL && hasTE {
		return nil, nil, h1.ErrLengthAndChunked
	}
	req := &http.Request{
		Method:     method,
		URL:        u,
		Proto:      rl.Proto,
		ProtoMajor: rl.Major,
		ProtoMinor: rl.Minor,
		Header:     h,
		Body:       http.NoBody,
		Host:       u.Host,
		RequestURI: uri,
	}
	if hosts := h["Host"]; len(hosts) > 1 {
		return nil, nil, badRequest("too many Host headers")
	} else if req.Host == "" && len(hosts) == 1 {
		req.Host = hosts[0]
	}
	req.Close = h1.Closes(rl.Major, rl.Minor, h["Connection"])

	f, err := h1.Frame(h, rl.Major, rl.Minor, true)
	if err != nil {
		return nil, nil, err
	}
	req.ContentLength = f.Length
	if f.Length < 0 {
		req.ContentLength = 0
	}
	if f.Chunked {
		req.ContentLength = -1
		req.TransferEncoding = []string{"chunked"}
	}

	if badName != "" {
		return nil, nil, badRequest("header field name %q", badName)
	}
	if rl.Major != 1 {
		return nil, nil, &h1.Error{Err: h1.ErrUnsupportedVersion, Detail: rl.Proto}
	}
	if f.Coded && !f.Chunked {
		// HTTP/1.0 has no transfer codings: net/http answers 501.
		return nil, nil, &h1.Error{Err: h1.ErrUnsupportedCoding, Detail: fmt.Sprintf("%q", req.TransferEncoding)}
	}
	if e := field(h, "Expect"); e != "" && !strings.EqualFold(e, "100-continue") {
		return nil, nil, &h1.Error{Err: h1.ErrExpectation, Detail: strconv.Quote(e)}
	}
	delete(h, "Host") // it is req.Host, as net/http has it
	return req, order, nil
}

// canonicalKey is h1.CanonicalKey.
func canonicalKey(k string) (string, bool) { return h1.CanonicalKey(k) }

// asciiEqualFold is h1.EqualFoldASCII.
func asciiEqualFold(s, t string) bool { return h1.EqualFoldASCII(s, t) }

// asciiLowerIs reports whether b, with its ASCII letters lowered, is lower.
func asciiLowerIs(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// chunked reports whether the request's body is chunked.
func chunked(req *http.Request) bool { return len(req.TransferEncoding) > 0 }

// bodyReader returns the reader of the request body on the client
// connection: a chunked decoder that also consumes the trailer section
// (bounded by br's buffer, as in net/http), or a reader of exactly
// Content-Length bytes. nil when there is no body.
func bodyReader(req *http.Request, br *bufio.Reader) io.Reader {
	switch {
	case chunked(req):
		return &chunkedBody{h1.NewChunkedReader(br)}
	case req.ContentLength > 0:
		return h1.NewSized(br, req.ContentLength)
	}
	return nil
}

// chunkedBody is a chunked request body whose errors of syntax are the
// client's: h1.ErrMalformed. An error of the connection is returned as it
// is, as a Content-Length body's is: a stalled body's deadline is a 408,
// not a 400. Trailers are not forwarded.
type chunkedBody struct{ r *h1.ChunkedReader }

func (b *chunkedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		var ne net.Error
		if errors.As(err, &ne) {
			err = fmt.Errorf("chunked body: %w", err)
		} else {
			err = badRequest("chunked body: %v", err)
		}
	}
	return n, err
}
