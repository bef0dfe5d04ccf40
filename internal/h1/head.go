package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// SkipEmptyLines passes over up to max empty lines before a request line,
// as a server should (RFC 9112 section 2.2); one more is ErrMalformed.
func SkipEmptyLines(br *bufio.Reader, max int) error {
	for skipped := 0; ; skipped++ {
		b, err := br.Peek(1)
		if err != nil {
			return err
		}
		if b[0] != '\r' && b[0] != '\n' {
			return nil
		}
		if skipped >= max {
			return errorf(ErrMalformed, "empty lines before the request line")
		}
		if _, err := br.ReadSlice('\n'); err != nil {
			return err
		}
	}
}

// ReadHead appends one head read from br to buf and returns it: the start
// line, the field lines and the empty line that ends them, as they came
// (CRLF or a bare LF). A line of nothing but CR and LF bytes ends the head
// (ParseFields refuses one with a CR too many). The limits are enforced as
// it reads, so a peer cannot make it hold more than lim.MaxBytes: the start
// line alone past them is ErrStartLineTooLong, the head ErrHeadTooLarge,
// more field lines than lim.MaxFields ErrTooManyFields. A stream that ends
// before the head is io.EOF if nothing of it came, else
// io.ErrUnexpectedEOF; other read errors are returned as they are.
func ReadHead(br *bufio.Reader, buf []byte, lim Limits) ([]byte, error) {
	base := len(buf)
	var err error
	buf, err = readLine(br, buf, base, lim.MaxBytes)
	if errors.Is(err, ErrHeadTooLarge) {
		return buf, &Error{Err: ErrStartLineTooLong}
	}
	if err != nil {
		return buf, err
	}
	if blank(buf[base:]) {
		return buf, errorf(ErrMalformed, "empty start line")
	}
	for n := 0; ; n++ {
		start := len(buf)
		buf, err = readLine(br, buf, base, lim.MaxBytes)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return buf, err
		}
		if blank(buf[start:]) {
			return buf, nil
		}
		if lim.MaxFields > 0 && n >= lim.MaxFields {
			return buf, &Error{Err: ErrTooManyFields}
		}
	}
}

// blank reports whether line has only CR and LF bytes.
func blank(line []byte) bool { return len(bytes.TrimRight(line, "\r\n")) == 0 }

// readLine appends one line, LF included, to buf, refusing to let
// buf[base:] grow past max (when max > 0).
func readLine(br *bufio.Reader, buf []byte, base, max int) ([]byte, error) {
	start := len(buf)
	for {
		frag, err := br.ReadSlice('\n')
		if max > 0 && len(buf)-base+len(frag) > max {
			return buf, &Error{Err: ErrHeadTooLarge}
		}
		buf = append(buf, frag...)
		switch {
		case err == nil:
			return buf, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(buf) > start:
			return buf, io.ErrUnexpectedEOF
		}
		return buf, err
	}
}

// CutLine cuts the first line off s: the line without its LF and a CR
// before it (as bufio.Reader.ReadLine), and the rest after the LF.
func CutLine(s string) (line, rest string) {
	i := strings.IndexByte(s, '\n')
	if i < 0 {
		return s, ""
	}
	line, rest = s[:i], s[i+1:]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, rest
}

// RequestLine is a request line cut into its parts (RFC 9112 section 3).
type RequestLine struct {
	Method, Target, Proto string
	Major, Minor          int
}

// ParseRequestLine cuts a request line (without its line end) as
// net/http.ReadRequest does: three parts split by single spaces (ErrMalformed),
// a token method (ErrMalformed), an HTTP/x.y version (ErrBadVersion). The
// target is the caller's to parse.
func ParseRequestLine(line string) (RequestLine, error) {
	method, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 {
		return RequestLine{}, errorf(ErrMalformed, "malformed HTTP request %q", clip(line))
	}
	if !IsToken(method) {
		return RequestLine{}, errorf(ErrMalformed, "invalid method %q", clip(method))
	}
	major, minor, ok := http.ParseHTTPVersion(proto)
	if !ok {
		return RequestLine{}, errorf(ErrBadVersion, "malformed HTTP version %q", clip(proto))
	}
	return RequestLine{Method: method, Target: target, Proto: proto, Major: major, Minor: minor}, nil
}

// StatusLine is a status line cut into its parts (RFC 9112 section 4).
type StatusLine struct {
	Proto        string
	Major, Minor int
	Code         int
	Status       string // the code and the reason phrase: "200 OK"
}

// ParseStatusLine cuts a status line (without its line end), taking what
// net/http.ReadResponse takes: a version and a status, split by a space; a
// status that is three digits from 100, then a space and a reason phrase or
// nothing. A CR or NUL byte in it is ErrMalformed; a version that is not
// HTTP/x.y, ErrBadVersion.
func ParseStatusLine(line string) (StatusLine, error) {
	if strings.IndexByte(line, '\r') >= 0 || strings.IndexByte(line, 0) >= 0 {
		return StatusLine{}, errorf(ErrMalformed, "control character in the status line")
	}
	proto, status, ok := strings.Cut(line, " ")
	if !ok {
		return StatusLine{}, errorf(ErrMalformed, "status line %q", clip(line))
	}
	sl := StatusLine{Proto: proto, Status: strings.TrimLeft(status, " ")}
	code, _, _ := strings.Cut(sl.Status, " ")
	n, err := strconv.Atoi(code)
	if len(code) != 3 || err != nil || n < 100 {
		return StatusLine{}, errorf(ErrMalformed, "status code %q", clip(code))
	}
	sl.Code = n
	if sl.Major, sl.Minor, ok = http.ParseHTTPVersion(proto); !ok {
		return StatusLine{}, errorf(ErrBadVersion, "malformed HTTP version %q", clip(proto))
	}
	return sl, nil
}

// ParseFields parses a field section (what follows the start line, up to
// and including the empty line) into a header with canonical keys. With
// keepOrder it also returns the names as sent, one per field line, in the
// order sent. The names and values are parts of s; the values of names
// sent once share one array.
//
// It refuses (ErrMalformed) a line without a colon, white space before the
// first field, a name that is not a token, and a value with a control
// character other than a tab; a line that starts with white space after
// the first is ErrObsFold. Values are trimmed of spaces and tabs. A name
// that is a token but for spaces ("Host :") is not refused here but
// returned as badName: net/http refuses it only after the framing checks,
// and the request side answers with the status of the first rule broken,
// as net/http would.
func ParseFields(s string, keepOrder bool) (h http.Header, order []string, badName string, err error) {
	n := max(strings.Count(s, "\n")-1, 0) // the field lines, the empty line aside
	var vals []string                     // one array for the values (most names come once) and the order
	if keepOrder {
		vals = make([]string, 2*n)
		vals, order = vals[:n:n], vals[n:n:2*n]
		h = make(http.Header, n+1) // and room for the caller's key of the order
	} else {
		vals = make([]string, n)
		h = make(http.Header, n)
	}
	for i := 0; ; i++ {
		var line string
		line, s = CutLine(s)
		if line == "" {
			return h, order, badName, nil
		}
		if i == 0 && (line[0] == ' ' || line[0] == '\t') {
			return nil, nil, "", errorf(ErrMalformed, "white space before the first header field %q", clip(line))
		}
		if strings.IndexByte(line, ':') < 0 {
			return nil, nil, "", errorf(ErrMalformed, "header line without a colon %q", clip(line))
		}
		kv := trimLWS(line)
		if len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
			return nil, nil, "", errorf(ErrObsFold, "obsolete line folding in header field %q", clip(line))
		}
		k, v, _ := strings.Cut(kv, ":")
		key, ok := CanonicalKey(k)
		if !ok {
			if k == "" || !tokenOrSpace(k) {
				return nil, nil, "", errorf(ErrMalformed, "header field name %q", clip(k))
			}
			if badName == "" {
				badName = k
			}
			key = k
		}
		for j := 0; j < len(v); j++ {
			if c := v[j]; c < ' ' && c != '\t' || c == 0x7f {
				return nil, nil, "", errorf(ErrMalformed, "value of header field %q", clip(key))
			}
		}
		v = strings.TrimLeft(v, " \t")
		if keepOrder {
			order = append(order, k)
		}
		if vv := h[key]; vv != nil {
			h[key] = append(vv, v)
		} else if len(vals) > 0 {
			vals[0] = v
			h[key], vals = vals[:1:1], vals[1:]
		} else {
			h[key] = []string{v}
		}
	}
}

// trimLWS trims spaces and tabs at both ends (as net/textproto does with
// a header line).
func trimLWS(s string) string {
	i, j := 0, len(s)
	for i < j && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	for j > i && (s[j-1] == ' ' || s[j-1] == '\t') {
		j--
	}
	return s[i:j]
}

// clip shortens what an error quotes.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80]
	}
	return s
}

// tokenBytes marks the bytes of a token (RFC 9110 section 5.6.2).
var tokenBytes = func() (t [256]bool) {
	for c := range 128 {
		t[c] = httpguts.IsTokenRune(rune(c))
	}
	return t
}()

// IsToken reports whether s is a token (RFC 9110 section 5.6.2).
func IsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenBytes[s[i]] {
			return false
		}
	}
	return true
}

// tokenOrSpace reports whether s has only token bytes and spaces.
func tokenOrSpace(s string) bool {
	for i := 0; i < len(s); i++ {
		if !tokenBytes[s[i]] && s[i] != ' ' {
			return false
		}
	}
	return true
}

// CanonicalKey returns the canonical form of the field name k
// (Content-Type), as net/textproto makes it, or false if k is not a token.
// It allocates only for a name sent in another form and not among the
// common ones (textproto.CanonicalMIMEHeaderKey allocates for any name it
// changes longer than 32 bytes or not among its own common ones).
func CanonicalKey(k string) (string, bool) {
	if !IsToken(k) {
		return "", false
	}
	upper, canon := true, true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			canon = false
			break
		}
		upper = c == '-'
	}
	if canon {
		return k, true
	}
	var buf [64]byte
	b := buf[:0]
	if len(k) > len(buf) {
		b = make([]byte, 0, len(k))
	}
	upper = true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
		upper = c == '-'
	}
	if common, ok := commonKeys[string(b)]; ok {
		return common, true
	}
	return string(b), true
}

// commonKeys are field names a peer may send in lower case (HTTP/2 habits,
// hand-written clients, proxies that lower every name), interned so that
// they cost nothing. The Egret- ones are egret's own request fields.
var commonKeys = func() map[string]string {
	m := make(map[string]string)
	for _, k := range []string{
		"Accept", "Accept-Charset", "Accept-Encoding", "Accept-Language", "Accept-Ranges",
		"Age", "Authorization", "Baggage", "Cache-Control", "Connection", "Content-Encoding",
		"Content-Length", "Content-Type", "Cookie", "Date", "Etag", "Expect", "Expires",
		"Forwarded", "Host", "If-Match", "If-Modified-Since", "If-None-Match",
		"If-Unmodified-Since", "Keep-Alive", "Last-Modified", "Location", "Origin", "Pragma",
		"Proxy-Authorization", "Proxy-Connection", "Range", "Referer", "Retry-After", "Server",
		"Set-Cookie", "Te", "Traceparent", "Tracestate", "Trailer", "Transfer-Encoding",
		"Upgrade", "User-Agent", "Vary", "Via", "X-Forwarded-For", "X-Forwarded-Host",
		"X-Forwarded-Proto", "X-Request-Id", "Egret-Request-Id", "Egret-Timeout-Ms",
		"Idempotency-Key",
	} {
		m[k] = k
	}
	return m
}()

// EqualFoldASCII reports whether s and t are equal, ASCII case folded
// (strings.EqualFold also folds other letters: the Kelvin sign is a k).
func EqualFoldASCII(s, t string) bool {
	if len(s) != len(t) {
		return false
	}
	for i := 0; i < len(s); i++ {
		a, b := s[i], t[i]
		if 'A' <= a && a <= 'Z' {
			a += 'a' - 'A'
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}
