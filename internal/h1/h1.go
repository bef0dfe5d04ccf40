// Package h1 is egret's HTTP/1.x framing (RFC 9112), one module for both
// sides of the proxy: the heads and bodies of client requests (proxy) and of
// upstream responses (retry). It reads a head under limits (ReadHead), cuts
// its start line (ParseRequestLine, ParseStatusLine) and field lines
// (ParseFields), decides how the body is delimited (Frame, Closes), and reads
// and writes bodies (Sized, ChunkedReader, WriteChunk).
//
// What it takes and refuses is what net/http.ReadRequest and ReadResponse
// do, but for obsolete line folding, refused in both directions as RFC 9112
// section 5.2 lets a proxy do (net/http joins the lines: a field joined here
// could be read otherwise by the next hop). proxy's FuzzParseHead and
// retry's FuzzReadResponse hold it to net/http.
//
// Why not net/textproto's Reader: ReadMIMEHeader joins folded lines, does not
// keep the names as sent nor their order (egret forwards both), and
// allocates a string per name and value. Here a head is read into the
// caller's buffer, copied once into a string, and the names and values are
// parts of that string; the values share one array. On a 6-field request
// head that is 4 allocations where textproto makes 10
// (BenchmarkParseFields). Where net/http's readers serve they are used:
// the chunked decoder is net/http's (httputil.NewChunkedReader), and the
// trailer section, which egret drops, is read as net/http reads it, with
// net/textproto.
//
// Errors of syntax or framing are *Error values wrapping one of the
// sentinels below, matched with errors.Is: the one set of HTTP/1 error
// values. The request side answers them with a status (proxy's statusOf),
// the response side takes them as a bad upstream response.
package h1

import (
	"errors"
	"fmt"
)

var (
	// ErrMalformed: the message does not follow the syntax, or its
	// framing fields contradict each other. ErrObsFold, ErrBadLength and
	// ErrBadVersion are ErrMalformed too.
	ErrMalformed = errors.New("malformed HTTP/1 message")
	// ErrObsFold: a field line continued on the next line (obs-fold).
	ErrObsFold = fmt.Errorf("%w: obsolete line folding", ErrMalformed)
	// ErrBadLength: Content-Length values that are not one number.
	ErrBadLength = fmt.Errorf("%w: bad Content-Length", ErrMalformed)
	// ErrLengthAndChunked: a request with both Content-Length and
	// Transfer-Encoding (RFC 9112 section 6.1 lets a server refuse it).
	ErrLengthAndChunked = errors.New("Content-Length together with Transfer-Encoding")
	// ErrUnsupportedCoding: a transfer coding other than chunked.
	ErrUnsupportedCoding = errors.New("transfer coding not implemented")
	// ErrUnsupportedVersion: a version other than HTTP/1.x (a request
	// with one is answered 505).
	ErrUnsupportedVersion = errors.New("HTTP version not supported")
	// ErrBadVersion: a start line whose version is not HTTP/x.y: malformed,
	// and no version supported either (net/http answers such a request
	// 505, so the proxy does).
	ErrBadVersion = fmt.Errorf("%w: %w", ErrMalformed, ErrUnsupportedVersion)
	// ErrExpectation: a request's Expect other than 100-continue.
	ErrExpectation = errors.New("expectation not supported")
	// ErrStartLineTooLong: the start line alone passes Limits.MaxBytes.
	ErrStartLineTooLong = errors.New("start line too long")
	// ErrHeadTooLarge: the head (or a trailer section) passes
	// Limits.MaxBytes.
	ErrHeadTooLarge = errors.New("header section too large")
	// ErrTooManyFields: more field lines than Limits.MaxFields.
	ErrTooManyFields = errors.New("too many header fields")
)

// Error is an error of a message's syntax or framing: Err is one of the
// sentinels, Detail what was found where, in words that stand alone
// (`obsolete line folding in header field "X-A: a"`), so that a side can
// put its own sentinel before them. Empty: nothing to add.
type Error struct {
	Err    error
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return e.Err.Error()
	}
	if errors.Is(e.Err, ErrMalformed) {
		return ErrMalformed.Error() + ": " + e.Detail
	}
	return e.Err.Error() + ": " + e.Detail
}

func (e *Error) Unwrap() error { return e.Err }

func errorf(sentinel error, format string, args ...any) error {
	return &Error{Err: sentinel, Detail: fmt.Sprintf(format, args...)}
}

// Limits bound a head or a trailer section; zero is no bound.
type Limits struct {
	MaxBytes  int // start line and field lines, line ends included
	MaxFields int // field lines
}
