package retry

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/egret-proxy/egret/internal/h1body"
)

// errMalformedResponse: the upstream's response head is not HTTP/1.x.
var errMalformedResponse = errors.New("malformed HTTP response")

// maxHeaderFields bounds the header fields of one response head.
const maxHeaderFields = 1000

// readResponse reads one response head from br and frames its body as RFC
// 9112 section 6.3 says, taking and refusing what net/http.ReadResponse
// does: the whole head is copied into one string that the status, keys and
// values are cut from, so that a response costs a few allocations rather
// than one per line.
func readResponse(br *bufio.Reader, req *http.Request, sc *headScratch) (*http.Response, error) {
	if sc == nil {
		sc = &headScratch{}
	}
	head, ends := sc.head[:0], sc.ends[:0] // the head's bytes; the end offset of each line
	defer func() {
		if cap(head) <= 16<<10 && cap(ends) <= 256 { // a huge head's room is not kept
			sc.head, sc.ends = head[:0], ends[:0]
		} else {
			sc.head, sc.ends = nil, nil
		}
	}()
	for {
		line, err := readHeadLine(br)
		if err != nil {
			if err == io.EOF && len(ends) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if len(line) == 0 {
			if len(ends) == 0 {
				return nil, fmt.Errorf("%w: empty status line", errMalformedResponse)
			}
			break
		}
		if len(ends) > maxHeaderFields {
			return nil, fmt.Errorf("%w: more than %d header fields", errMalformedResponse, maxHeaderFields)
		}
		head = append(head, line...)
		ends = append(ends, len(head))
	}
	s := string(head)
	statusLine := s[:ends[0]]
	resp := &http.Response{Request: req}
	proto, status, ok := strings.Cut(statusLine, " ")
	if !ok {
		return nil, fmt.Errorf("%w: status line %q", errMalformedResponse, statusLine)
	}
	resp.Proto = proto
	resp.Status = strings.TrimLeft(status, " ")
	code, _, _ := strings.Cut(resp.Status, " ")
	if len(code) != 3 {
		return nil, fmt.Errorf("%w: status code %q", errMalformedResponse, code)
	}
	n, err := strconv.Atoi(code)
	if err != nil || n < 100 {
		return nil, fmt.Errorf("%w: status code %q", errMalformedResponse, code)
	}
	resp.StatusCode = n
	if resp.ProtoMajor, resp.ProtoMinor, ok = http.ParseHTTPVersion(proto); !ok || resp.ProtoMajor != 1 {
		return nil, fmt.Errorf("%w: version %q", errMalformedResponse, proto)
	}

	// Header fields. An obs-fold (a line that continues the previous one) is
	// refused, as RFC 9112 section 5.2 lets a proxy do (with a 502).
	h := make(http.Header, len(ends)-1)
	values := make([]string, 0, len(ends)-1)
	for i := 1; i < len(ends); i++ {
		line := s[ends[i-1]:ends[i]]
		if line[0] == ' ' || line[0] == '\t' {
			return nil, fmt.Errorf("%w: obsolete line folding in the header", errMalformedResponse)
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok || k == "" || !httpguts.ValidHeaderFieldName(k) {
			return nil, fmt.Errorf("%w: header line %q", errMalformedResponse, line)
		}
		v = strings.Trim(v, " \t")
		if !httpguts.ValidHeaderFieldValue(v) {
			return nil, fmt.Errorf("%w: value of header field %q", errMalformedResponse, k)
		}
		k = textproto.CanonicalMIMEHeaderKey(k)
		if vv := h[k]; vv != nil {
			h[k] = append(vv, v)
			continue
		}
		values = append(values, v)
		h[k] = values[len(values)-1 : len(values) : len(values)]
	}
	resp.Header = h
	if err := frame(resp, br, req); err != nil {
		return nil, err
	}
	return resp, nil
}

// headScratch is the room a connection reads its response heads in, kept
// from one response to the next (off the goroutine's stack, which a proxy
// keeps for each idle client connection).
type headScratch struct {
	head []byte
	ends []int
}

// readHeadLine returns the next line without its CRLF (or LF), valid until
// the next read of br; a line longer than br's buffer is put together.
func readHeadLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		long := append([]byte(nil), line...)
		for err == bufio.ErrBufferFull {
			line, err = br.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	if bytes.IndexByte(line, '\r') >= 0 || bytes.IndexByte(line, 0) >= 0 {
		return nil, fmt.Errorf("%w: control character in the head", errMalformedResponse)
	}
	return line, nil
}

// frame sets the response's body, length and connection handling (RFC 9112
// section 6.3 and 9.3).
func frame(resp *http.Response, br *bufio.Reader, req *http.Request) error {
	h := resp.Header
	resp.Close = closes(resp)
	if resp.Close && resp.ProtoMinor >= 1 {
		// As net/http: a close is the transport's business.
		h.Del("Connection")
	}
	code := resp.StatusCode
	noBody := req != nil && req.Method == http.MethodHead || code < 200 || code == http.StatusNoContent || code == http.StatusNotModified
	if !resp.ProtoAtLeast(1, 1) {
		delete(h, "Transfer-Encoding") // HTTP/1.0 has no transfer codings
	}
	if te := h["Transfer-Encoding"]; len(te) > 0 {
		if len(te) != 1 || !strings.EqualFold(strings.TrimSpace(te[0]), "chunked") {
			return fmt.Errorf("%w: unsupported transfer encoding %q", errMalformedResponse, strings.Join(te, ", "))
		}
		// Chunked wins over any Content-Length (RFC 9112 section 6.3).
		h.Del("Content-Length")
		delete(h, "Transfer-Encoding")
		resp.TransferEncoding = []string{"chunked"}
		if noBody {
			resp.Body, resp.ContentLength = http.NoBody, 0
			if req != nil && req.Method == http.MethodHead {
				resp.ContentLength = -1
			}
			return nil
		}
		resp.ContentLength = -1
		resp.Body = &chunkedBody{br: br, r: httputil.NewChunkedReader(br)}
		return nil
	}
	cl := int64(-1)
	if vv := h["Content-Length"]; len(vv) > 0 {
		first := strings.TrimSpace(vv[0])
		for _, v := range vv[1:] {
			if strings.TrimSpace(v) != first {
				return fmt.Errorf("%w: differing Content-Length values", errMalformedResponse)
			}
		}
		n, err := strconv.ParseUint(first, 10, 63)
		if err != nil || first == "" || first[0] == '+' {
			return fmt.Errorf("%w: bad Content-Length %q", errMalformedResponse, first)
		}
		cl = int64(n)
		if len(vv) > 1 {
			h["Content-Length"] = vv[:1]
		}
	}
	switch {
	case noBody:
		resp.Body = http.NoBody
		resp.ContentLength = 0
		if req != nil && req.Method == http.MethodHead {
			resp.ContentLength = cl
		}
	case cl == 0:
		resp.Body, resp.ContentLength = http.NoBody, 0
	case cl > 0:
		resp.Body, resp.ContentLength = h1body.NewSized(br, cl), cl
	default:
		// Neither: the body is what comes until the upstream closes.
		resp.Close = true
		resp.ContentLength = -1
		resp.Body = io.NopCloser(br)
	}
	return nil
}

// closes reports whether the connection ends with this response: HTTP/1.0
// unless kept alive, or a close in Connection.
func closes(resp *http.Response) bool {
	conn := resp.Header["Connection"]
	if resp.ProtoMajor == 1 && resp.ProtoMinor == 0 {
		return !httpguts.HeaderValuesContainsToken(conn, "keep-alive")
	}
	return httpguts.HeaderValuesContainsToken(conn, "close")
}

// chunkedBody reads a chunked body and, at its end, the trailer section
// (dropped: egret does not relay trailers).
type chunkedBody struct {
	br   *bufio.Reader
	r    io.Reader
	done bool
}

func (b *chunkedBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		// The trailer section: lines ending in CRLF, then an empty one.
		for fields := 0; ; fields++ {
			line, lerr := b.br.ReadSlice('\n')
			if lerr != nil {
				if lerr == io.EOF {
					lerr = io.ErrUnexpectedEOF
				}
				return n, fmt.Errorf("reading the trailer: %w", lerr)
			}
			if !bytes.HasSuffix(line, []byte("\r\n")) {
				return n, fmt.Errorf("%w: trailer line without CRLF", errMalformedResponse)
			}
			if len(line) == 2 {
				break
			}
			if k, v, ok := bytes.Cut(line[:len(line)-2], []byte(":")); !ok || !httpguts.ValidHeaderFieldName(string(k)) ||
				!httpguts.ValidHeaderFieldValue(string(bytes.Trim(v, " \t"))) {
				return n, fmt.Errorf("%w: trailer line %q", errMalformedResponse, line)
			}
			if fields > maxHeaderFields {
				return n, fmt.Errorf("%w: trailer too long", errMalformedResponse)
			}
		}
		b.done = true
	}
	return n, err
}

func (b *chunkedBody) Close() error { return nil }
