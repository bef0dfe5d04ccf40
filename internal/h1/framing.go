package h1

import (
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// Framing is how a message's body is delimited (RFC 9112 section 6.3), as
// far as its header fields say: chunked, Length bytes, or neither (a
// request then has no body, a response ends when the connection does, and
// one that cannot have a body, by its status or its request's method, has
// none whatever its fields say: that is the caller's to know).
type Framing struct {
	Chunked bool  // the chunked transfer coding; Length is -1
	Length  int64 // the Content-Length; -1 when none was sent
	// Coded: a Transfer-Encoding was sent. In HTTP/1.0, which has no
	// transfer codings, it is dropped and Chunked stays false (net/http
	// then answers a request 501; a response is framed without it).
	Coded bool
}

// Frame reads a message's framing fields, as net/http does for both
// requests and responses:
//   - Transfer-Encoding (removed from h) is taken in HTTP/1.1 and later
//     (and an unset version, 0.0) as one field with one coding, chunked
//     (ASCII case folded): more than one field is ErrMalformed, another
//     coding ErrUnsupportedCoding;
//   - with chunked, Content-Length is removed: the coding wins (RFC 9112
//     section 6.3, item 3); a request may not have both
//     (ErrLengthAndChunked, item 3 allows a server to refuse it, and egret
//     does rather than let the next hop choose), whatever its version;
//   - Content-Length values (repeated fields) must be one and the same
//     decimal number, kept once (ErrBadLength);
//   - with chunked, the Trailer field is removed, and refused
//     (ErrMalformed) if it announces Transfer-Encoding, Trailer or
//     Content-Length.
func Frame(h http.Header, major, minor int, request bool) (Framing, error) {
	f := Framing{Length: -1}
	te, coded := h["Transfer-Encoding"]
	if _, sized := h["Content-Length"]; request && coded && sized {
		return f, &Error{Err: ErrLengthAndChunked}
	}
	if coded {
		f.Coded = true
		delete(h, "Transfer-Encoding")
		if major > 1 || major == 1 && minor >= 1 || major == 0 && minor == 0 {
			if len(te) != 1 {
				return f, errorf(ErrMalformed, "too many transfer encodings: %q", te)
			}
			if !EqualFoldASCII(te[0], "chunked") {
				return f, errorf(ErrUnsupportedCoding, "unsupported transfer encoding: %q", te[0])
			}
			f.Chunked = true
			delete(h, "Content-Length")
		}
	}
	if cls := h["Content-Length"]; len(cls) > 0 {
		n, err := contentLength(cls)
		if err != nil {
			return f, err
		}
		if len(cls) > 1 {
			h["Content-Length"] = cls[:1:1]
		}
		f.Length = n
	}
	if f.Chunked {
		if tr, ok := h["Trailer"]; ok {
			delete(h, "Trailer")
			if err := checkTrailerKeys(tr); err != nil {
				return f, err
			}
		}
	}
	return f, nil
}

// contentLength is the one length that the Content-Length values cls give;
// cls[0] is left trimmed.
func contentLength(cls []string) (int64, error) {
	first := textproto.TrimString(cls[0])
	for _, v := range cls[1:] {
		if textproto.TrimString(v) != first {
			return 0, errorf(ErrBadLength, "multiple Content-Length headers; got %q", cls)
		}
	}
	cls[0] = first
	if first == "" {
		return 0, errorf(ErrBadLength, "invalid empty Content-Length")
	}
	n, err := strconv.ParseUint(first, 10, 63) // no sign, no base prefix
	if err != nil {
		return 0, errorf(ErrBadLength, "bad Content-Length %q", clip(first))
	}
	return int64(n), nil
}

// checkTrailerKeys refuses a Trailer field that announces a field that
// must not be a trailer, as net/http does.
func checkTrailerKeys(vs []string) error {
	for _, v := range vs {
		for f := range strings.SplitSeq(v, ",") {
			switch http.CanonicalHeaderKey(textproto.TrimString(f)) {
			case "Transfer-Encoding", "Trailer", "Content-Length":
				return errorf(ErrMalformed, "bad trailer key %q", textproto.TrimString(f))
			}
		}
	}
	return nil
}

// Closes reports whether the connection ends after a message of this
// version with these Connection field values, as net/http decides for
// requests and responses alike: before HTTP/1, always; in HTTP/1.0 unless
// kept alive (and not also closed); later, when closed.
func Closes(major, minor int, connection []string) bool {
	if major < 1 {
		return true
	}
	closed := httpguts.HeaderValuesContainsToken(connection, "close")
	if major == 1 && minor == 0 {
		return closed || !httpguts.HeaderValuesContainsToken(connection, "keep-alive")
	}
	return closed
}
