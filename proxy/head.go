package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"

	"golang.org/x/net/http/httpguts"
)

// Errors of reading a client request; each maps to the status the client is
// answered with (statusOf). Match them with errors.Is.
var (
	ErrHeaderTooLarge     = errors.New("request header fields too large")
	ErrTooManyHeaders     = errors.New("too many request header fields")
	ErrURITooLong         = errors.New("request line too long")
	ErrLengthAndChunked   = errors.New("Content-Length together with Transfer-Encoding")
	ErrBadRequest         = errors.New("malformed request")
	ErrUnsupportedVersion = errors.New("HTTP version not supported")
	ErrUnsupportedCoding  = errors.New("transfer coding not implemented")
	ErrExpectation        = errors.New("expectation not supported")
)

// headLimits bound the head of a client request.
type headLimits struct {
	maxBytes int // request line + header fields
	maxCount int // header fields
}

// statusOf is the status answered for an error of reading a request.
func statusOf(err error) int {
	switch {
	case errors.Is(err, ErrHeaderTooLarge), errors.Is(err, ErrTooManyHeaders):
		return http.StatusRequestHeaderFieldsTooLarge
	case errors.Is(err, ErrURITooLong):
		return http.StatusRequestURITooLong
	case errors.Is(err, ErrUnsupportedVersion):
		return http.StatusHTTPVersionNotSupported
	case errors.Is(err, ErrUnsupportedCoding):
		return http.StatusNotImplemented
	case errors.Is(err, ErrExpectation):
		return http.StatusExpectationFailed
	}
	return http.StatusBadRequest
}

// readHead reads one request head (request line, header fields and the empty
// line) into buf and returns it. Empty lines before the request line are
// skipped (RFC 9112 section 2.2). It enforces the limits as it reads, so a
// client cannot make the proxy buffer more than maxBytes.
func readHead(br *bufio.Reader, buf []byte, lim headLimits) ([]byte, error) {
	buf = buf[:0]
	for skipped := 0; ; skipped++ {
		b, err := br.Peek(1)
		if err != nil {
			return buf, err
		}
		if b[0] != '\r' && b[0] != '\n' {
			break
		}
		if skipped >= 4 {
			return buf, fmt.Errorf("%w: empty lines before the request line", ErrBadRequest)
		}
		if _, err := br.ReadSlice('\n'); err != nil {
			return buf, err
		}
	}
	var err error
	buf, err = readLine(br, buf, lim.maxBytes)
	if errors.Is(err, ErrHeaderTooLarge) {
		return buf, ErrURITooLong
	}
	if err != nil {
		return buf, err
	}
	for n := 0; ; n++ {
		start := len(buf)
		buf, err = readLine(br, buf, lim.maxBytes)
		if err != nil {
			return buf, err
		}
		line := buf[start:]
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			return buf, nil
		}
		if n >= lim.maxCount {
			return buf, ErrTooManyHeaders
		}
	}
}

// readLine appends one line, LF included, to buf, refusing to let buf grow
// past max.
func readLine(br *bufio.Reader, buf []byte, max int) ([]byte, error) {
	for {
		frag, err := br.ReadSlice('\n')
		if len(buf)+len(frag) > max {
			return buf, ErrHeaderTooLarge
		}
		buf = append(buf, frag...)
		switch {
		case err == nil:
			return buf, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(buf) > 0:
			return buf, io.ErrUnexpectedEOF
		}
		return buf, err
	}
}

var headReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 1024) }}

// parseHead parses a head read by readHead. The returned request has no
// body yet (see attachBody). Framing is checked here: Content-Length with
// Transfer-Encoding, an unsupported transfer coding and a version other than
// HTTP/1.x are refused.
func parseHead(head []byte) (*http.Request, error) {
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
		return nil, ErrLengthAndChunked
	}
	br := headReaders.Get().(*bufio.Reader)
	br.Reset(bytes.NewReader(head))
	req, err := http.ReadRequest(br)
	br.Reset(nil)
	headReaders.Put(br)
	if err != nil {
		if strings.Contains(err.Error(), "unsupported transfer encoding") {
			return nil, fmt.Errorf("%w: %v", ErrUnsupportedCoding, err)
		}
		if strings.Contains(err.Error(), "malformed HTTP version") {
			return nil, fmt.Errorf("%w: %v", ErrUnsupportedVersion, err)
		}
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	for k, vs := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, fmt.Errorf("%w: header field name %q", ErrBadRequest, k)
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, fmt.Errorf("%w: value of header field %q", ErrBadRequest, k)
			}
		}
	}
	if req.ProtoMajor != 1 {
		return nil, fmt.Errorf("%w: %s", ErrUnsupportedVersion, req.Proto)
	}
	if hasTE && !(len(req.TransferEncoding) == 1 && req.TransferEncoding[0] == "chunked") {
		return nil, fmt.Errorf("%w: %q", ErrUnsupportedCoding, req.TransferEncoding)
	}
	if e := req.Header.Get("Expect"); e != "" && !strings.EqualFold(e, "100-continue") {
		return nil, fmt.Errorf("%w: %q", ErrExpectation, e)
	}
	return req, nil
}

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
// connection: a chunked decoder that also consumes the trailer section, or
// a reader of exactly Content-Length bytes. nil when there is no body.
func bodyReader(req *http.Request, br *bufio.Reader, maxTrailer int) io.Reader {
	switch {
	case chunked(req):
		return &chunkedBody{r: httputil.NewChunkedReader(br), br: br, max: maxTrailer}
	case req.ContentLength > 0:
		return &fixedBody{r: br, n: req.ContentLength}
	}
	return nil
}

// fixedBody reads exactly n bytes, and reports a body cut short as
// io.ErrUnexpectedEOF.
type fixedBody struct {
	r io.Reader
	n int64
}

func (b *fixedBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	if err == io.EOF && b.n > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err == io.EOF {
		err = nil
	}
	return n, err
}

// chunkedBody decodes a chunked body and, at its end, reads and drops the
// trailer section so that the connection is ready for the next request.
// Trailers are not forwarded.
type chunkedBody struct {
	r   io.Reader
	br  *bufio.Reader
	max int
	err error
}

func (b *chunkedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		err = b.trailer()
		if err == nil {
			err = io.EOF
		}
	}
	if err != nil {
		if err != io.EOF {
			err = fmt.Errorf("%w: chunked body: %v", ErrBadRequest, err)
		}
		b.err = err
	}
	return n, err
}

func (b *chunkedBody) trailer() error {
	var buf []byte
	for range 128 {
		start := len(buf)
		var err error
		buf, err = readLine(b.br, buf, b.max)
		if err != nil {
			return err
		}
		if len(bytes.TrimRight(buf[start:], "\r\n")) == 0 {
			return nil
		}
	}
	return ErrTooManyHeaders
}
