package client

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/egret-proxy/egret/internal/h1"
)

// errMalformedResponse: the upstream's response head is not HTTP/1.x.
var errMalformedResponse = errors.New("malformed HTTP response")

// maxHeaderFields bounds the header fields of one response head.
const maxHeaderFields = 1000

// readResponse reads one response head from br and frames its body as RFC
// 9112 section 6.3 says, with internal/h1 (the request side's framing too),
// taking and refusing what net/http.ReadResponse does but for obsolete line
// folding, refused: the whole head is copied into one string that the
// status, keys and values are cut from, so that a response costs a few
// allocations rather than one per line. The head's bytes are bounded by the
// connection (h1Conn.readHead), its fields by maxHeaderFields.
func readResponse(br *bufio.Reader, req *http.Request, sc *headScratch) (*http.Response, error) {
	if sc == nil {
		sc = &headScratch{}
	}
	head, err := h1.ReadHead(br, sc.head[:0], h1.Limits{MaxFields: maxHeaderFields})
	if cap(head) <= 16<<10 { // a huge head's room is not kept
		sc.head = head[:0]
	} else {
		sc.head = nil
	}
	if err != nil {
		return nil, responseError(err)
	}
	s := string(head)
	line, rest := h1.CutLine(s)
	sl, err := h1.ParseStatusLine(line)
	if err == nil && sl.Major != 1 {
		err = &h1.Error{Err: h1.ErrBadVersion, Detail: fmt.Sprintf("version %q", sl.Proto)}
	}
	if err != nil {
		return nil, responseError(err)
	}
	h, _, badName, err := h1.ParseFields(rest, false)
	if err == nil && badName != "" {
		err = &h1.Error{Err: h1.ErrMalformed, Detail: fmt.Sprintf("header field name %q", badName)}
	}
	if err != nil {
		return nil, responseError(err)
	}
	resp := &http.Response{
		Status:     sl.Status,
		StatusCode: sl.Code,
		Proto:      sl.Proto,
		ProtoMajor: sl.Major,
		ProtoMinor: sl.Minor,
		Header:     h,
		Request:    req,
	}
	if err := frame(resp, br, req); err != nil {
		return nil, responseError(err)
	}
	return resp, nil
}

// responseError turns an error of internal/h1 into errMalformedResponse,
// with h1's detail; other errors (of the connection) are returned as they
// are.
func responseError(err error) error {
	if err == nil {
		return nil
	}
	var e *h1.Error
	if !errors.As(err, &e) {
		return err
	}
	if e.Detail == "" {
		return fmt.Errorf("%w: %v", errMalformedResponse, e.Err)
	}
	return fmt.Errorf("%w: %s", errMalformedResponse, e.Detail)
}

// headScratch is the room a connection reads its response heads in, kept
// from one response to the next (off the goroutine's stack, which a proxy
// keeps for each idle client connection).
type headScratch struct {
	head []byte
}

// frame sets the response's body, length and connection handling (RFC 9112
// section 6.3 and 9.3; h1.Frame, h1.Closes).
func frame(resp *http.Response, br *bufio.Reader, req *http.Request) error {
	h := resp.Header
	resp.Close = h1.Closes(resp.ProtoMajor, resp.ProtoMinor, h["Connection"])
	if resp.Close && resp.ProtoMinor >= 1 {
		// As net/http: a close is the transport's business.
		h.Del("Connection")
	}
	f, err := h1.Frame(h, resp.ProtoMajor, resp.ProtoMinor, false)
	if err != nil {
		return err
	}
	head := req != nil && req.Method == http.MethodHead
	code := resp.StatusCode
	noBody := head || code < 200 || code == http.StatusNoContent || code == http.StatusNotModified
	if f.Chunked {
		resp.TransferEncoding = []string{"chunked"}
	}
	switch {
	case noBody:
		resp.Body, resp.ContentLength = http.NoBody, 0
		if head {
			resp.ContentLength = f.Length // -1 when chunked or none
		}
	case f.Chunked:
		resp.ContentLength = -1
		resp.Body = h1.NewChunkedReader(br)
	case f.Length == 0:
		resp.Body, resp.ContentLength = http.NoBody, 0
	case f.Length > 0:
		resp.Body, resp.ContentLength = h1.NewSized(br, f.Length), f.Length
	default:
		// Neither: the body is what comes until the upstream closes.
		resp.Close = true
		resp.ContentLength = -1
		resp.Body = io.NopCloser(br)
	}
	return nil
}
