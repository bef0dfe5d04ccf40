package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/egret-proxy/egret/internal/h1body"
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
// and makes every string of the request a part of one copy of the head.
// Obsolete line folding is refused (net/http joins the lines). Unlike
// net/http it does not add Cache-Control: no-cache to a request with
// Pragma: no-cache: the proxy forwards the header it was sent.
//
// It returns the header field names as sent, one per field line, in the
// order sent: the order the fields go upstream in (retry.Exchange's
// FieldOrder).
func parseHead(head []byte) (*http.Request, []string, error) {
	req, order, err := parseRequest(head)
	// Content-Length with Transfer-Encoding is refused before anything
	// else is looked at: parseRequest checks it once it has the fields;
	// when it failed before, the field lines are looked for here.
	if err != nil && !errors.Is(err, ErrLengthAndChunked) && lengthAndChunked(head) {
		return nil, nil, ErrLengthAndChunked
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
// Transfer-Encoding rule.
func parseRequest(head []byte) (*http.Request, []string, error) {
	s := string(head) // the one copy: methods, targets, names and values are parts of it
	line, rest := cutLine(s)
	method, rest1, ok1 := strings.Cut(line, " ")
	uri, proto, ok2 := strings.Cut(rest1, " ")
	if !ok1 || !ok2 {
		return nil, nil, fmt.Errorf("%w: malformed HTTP request %q", ErrBadRequest, line)
	}
	if !isToken(method) {
		return nil, nil, fmt.Errorf("%w: invalid method %q", ErrBadRequest, method)
	}
	major, minor, ok := http.ParseHTTPVersion(proto)
	if !ok {
		return nil, nil, fmt.Errorf("%w: malformed HTTP version %q", ErrUnsupportedVersion, proto)
	}
	// CONNECT names an authority (host:port), or a path as net/rpc does.
	rawURL := uri
	authority := method == http.MethodConnect && !strings.HasPrefix(uri, "/")
	if authority {
		rawURL = "http://" + uri
	}
	u, err := url.ParseRequestURI(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if authority {
		u.Scheme = ""
	}

	h, order, badName, err := parseFields(rest)
	if err != nil {
		return nil, nil, err
	}
	_, hasCL := h["Content-Length"]
	_, hasTE := h["Transfer-Encoding"]
	if hasCL && hasTE {
		return nil, nil, ErrLengthAndChunked
	}
	req := &http.Request{
		Method:     method,
		URL:        u,
		Proto:      proto,
		ProtoMajor: major,
		ProtoMinor: minor,
		Header:     h,
		Body:       http.NoBody,
		Host:       u.Host,
		RequestURI: uri,
	}
	if hosts := h["Host"]; len(hosts) > 1 {
		return nil, nil, fmt.Errorf("%w: too many Host headers", ErrBadRequest)
	} else if req.Host == "" && len(hosts) == 1 {
		req.Host = hosts[0]
	}
	conns := h["Connection"]
	switch {
	case major < 1:
		req.Close = true
	case major == 1 && minor == 0:
		req.Close = httpguts.HeaderValuesContainsToken(conns, "close") ||
			!httpguts.HeaderValuesContainsToken(conns, "keep-alive")
	default:
		req.Close = httpguts.HeaderValuesContainsToken(conns, "close")
	}

	// Framing. Transfer-Encoding is ignored (and refused below) in an
	// HTTP/1.0 request; an unset version counts as 1.1, as in net/http.
	isChunked := false
	if te, ok := h["Transfer-Encoding"]; ok {
		delete(h, "Transfer-Encoding")
		if major > 1 || major == 1 && minor >= 1 || major == 0 && minor == 0 {
			if len(te) != 1 {
				return nil, nil, fmt.Errorf("%w: too many transfer encodings: %q", ErrBadRequest, te)
			}
			if !asciiEqualFold(te[0], "chunked") {
				return nil, nil, fmt.Errorf("%w: unsupported transfer encoding: %q", ErrUnsupportedCoding, te[0])
			}
			isChunked = true
		}
	}
	if cls := h["Content-Length"]; len(cls) > 0 {
		first := textproto.TrimString(cls[0])
		for _, v := range cls[1:] {
			if textproto.TrimString(v) != first {
				return nil, nil, fmt.Errorf("%w: multiple Content-Length headers; got %q", ErrBadRequest, cls)
			}
		}
		if len(cls) > 1 {
			h["Content-Length"] = cls[:1:1]
			cls[0] = first
		}
		if first == "" {
			return nil, nil, fmt.Errorf("%w: invalid empty Content-Length", ErrBadRequest)
		}
		n, err := strconv.ParseUint(first, 10, 63)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: bad Content-Length %q", ErrBadRequest, first)
		}
		req.ContentLength = int64(n)
	}
	if isChunked {
		delete(h, "Content-Length")
		req.ContentLength = -1
		req.TransferEncoding = []string{"chunked"}
		if tr, ok := h["Trailer"]; ok {
			delete(h, "Trailer")
			if err := checkTrailerKeys(tr); err != nil {
				return nil, nil, err
			}
		}
	}

	if badName != "" {
		return nil, nil, fmt.Errorf("%w: header field name %q", ErrBadRequest, badName)
	}
	if major != 1 {
		return nil, nil, fmt.Errorf("%w: %s", ErrUnsupportedVersion, proto)
	}
	if hasTE && !isChunked {
		return nil, nil, fmt.Errorf("%w: %q", ErrUnsupportedCoding, req.TransferEncoding)
	}
	if e := field(h, "Expect"); e != "" && !strings.EqualFold(e, "100-continue") {
		return nil, nil, fmt.Errorf("%w: %q", ErrExpectation, e)
	}
	delete(h, "Host") // it is req.Host, as net/http has it
	return req, order, nil
}

// parseFields parses the header section (what follows the request line, up
// to and including the empty line) into a header with canonical keys, and
// the field names as sent, one per field line, in the order sent (the
// order they go upstream in). A name that is a token but for
// spaces is returned as badName rather than as an error, because net/http
// refuses it only after the framing checks.
func parseFields(s string) (h http.Header, order []string, badName string, err error) {
	n := strings.Count(s, "\n")
	vals := make([]string, 2*n) // one array for the values (most names come once) and the order
	vals, order = vals[:n:n], vals[n:n:2*n]
	h = make(http.Header, n+1)
	for i := 0; ; i++ {
		var line string
		line, s = cutLine(s)
		if line == "" {
			return h, order, badName, nil
		}
		if i == 0 && (line[0] == ' ' || line[0] == '\t') {
			return nil, nil, "", fmt.Errorf("%w: white space before the first header field %q", ErrBadRequest, clip(line))
		}
		if strings.IndexByte(line, ':') < 0 {
			return nil, nil, "", fmt.Errorf("%w: header line without a colon %q", ErrBadRequest, clip(line))
		}
		kv := trimLWS(line)
		// Obsolete line folding (a line that starts with white space
		// continues the field) is refused, as the response side refuses
		// it (RFC 9112 section 5.2 allows either): a field joined here
		// could be read otherwise by the upstream.
		if len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
			return nil, nil, "", fmt.Errorf("%w: obsolete line folding in header field %q", ErrBadRequest, clip(line))
		}
		k, v, _ := strings.Cut(kv, ":")
		key, ok := canonicalKey(k)
		if !ok {
			if k == "" || !tokenOrSpace(k) {
				return nil, nil, "", fmt.Errorf("%w: header field name %q", ErrBadRequest, clip(k))
			}
			if badName == "" {
				badName = k
			}
			key = k
		}
		for j := 0; j < len(v); j++ {
			if c := v[j]; c < ' ' && c != '\t' || c == 0x7f {
				return nil, nil, "", fmt.Errorf("%w: value of header field %q", ErrBadRequest, clip(key))
			}
		}
		v = strings.TrimLeft(v, " \t")
		order = append(order, k)
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

// cutLine cuts the first line off s: the line without its LF and a CR
// before it (as bufio.Reader.ReadLine), and the rest after the LF.
func cutLine(s string) (line, rest string) {
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

func isToken(s string) bool {
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

// canonicalKey returns the canonical form of the field name k
// (Content-Type), or false if k is not a token. It allocates only for a
// name sent in another form and not among the common ones.
func canonicalKey(k string) (string, bool) {
	if !isToken(k) {
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

// commonKeys are field names a client may send in lower case (HTTP/2
// habits, hand-written clients), interned so that they cost nothing.
var commonKeys = func() map[string]string {
	m := make(map[string]string)
	for _, k := range []string{
		"Accept", "Accept-Charset", "Accept-Encoding", "Accept-Language", "Authorization",
		"Baggage", "Cache-Control", "Connection", "Content-Encoding", "Content-Length",
		"Content-Type", "Cookie", "Date", "Expect", "Forwarded", "Host", "If-Match",
		"If-Modified-Since", "If-None-Match", "If-Unmodified-Since", "Keep-Alive", "Origin",
		"Pragma", "Proxy-Authorization", "Proxy-Connection", "Range", "Referer", "Te",
		"Traceparent", "Tracestate", "Trailer", "Transfer-Encoding", "Upgrade", "User-Agent",
		"Via", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Request-Id",
		HeaderRequestID, HeaderTimeoutMs, "Idempotency-Key",
	} {
		m[k] = k
	}
	return m
}()

// checkTrailerKeys refuses a chunked request whose Trailer header announces
// a field that must not be a trailer, as net/http does.
func checkTrailerKeys(vs []string) error {
	for _, v := range vs {
		for f := range strings.SplitSeq(v, ",") {
			switch http.CanonicalHeaderKey(textproto.TrimString(f)) {
			case "Transfer-Encoding", "Trailer", "Content-Length":
				return fmt.Errorf("%w: bad trailer key %q", ErrBadRequest, textproto.TrimString(f))
			}
		}
	}
	return nil
}

// asciiEqualFold reports whether s and t are equal, ASCII case folded.
func asciiEqualFold(s, t string) bool {
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
		return h1body.NewSized(br, req.ContentLength)
	}
	return nil
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
