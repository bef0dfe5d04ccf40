package smuggle

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
)

// The strict reference parser: RFC 9112's request grammar and nothing
// more. Where the RFC lets a recipient choose (a leading empty line, bare
// LF, obs-fold, a Content-Length list of equal values, a transfer coding
// other than chunked, a version other than 1.0 and 1.1), it refuses: the
// suite wants to know what an upstream that reads the RFC literally would
// make of the bytes, and an ambiguity is itself a finding.

// ErrIncomplete says the bytes end before the request does.
var ErrIncomplete = errors.New("incomplete request")

// ErrStrict is wrapped by every refusal of the strict parser.
var ErrStrict = errors.New("strict parser refused")

// Field is one field line, its name as sent.
type Field struct{ Name, Value string }

// Request is one request as the strict parser read it.
type Request struct {
	Method, Target, Version string
	Fields                  []Field
	Body                    []byte
	Chunked                 bool
	Trailers                []Field
	// Close: the connection ends after this request (Connection: close,
	// or HTTP/1.0 without keep-alive).
	Close bool
}

// Get returns the values of the fields named name (case-insensitive).
func (r *Request) Get(name string) []string {
	var vs []string
	for _, f := range r.Fields {
		if strings.EqualFold(f.Name, name) {
			vs = append(vs, f.Value)
		}
	}
	return vs
}

func refuse(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrStrict, fmt.Sprintf(format, a...))
}

// maxChunkDigits bounds a chunk size: 16 hex digits would overflow int64.
const maxChunkDigits = 15

// ParseRequest reads one request from the start of b. It returns the
// request and the bytes it took, ErrIncomplete when b ends inside it, or
// an error wrapping ErrStrict.
func ParseRequest(b []byte) (*Request, int, error) {
	line, rest, err := crlfLine(b)
	if err != nil {
		return nil, 0, err
	}
	r := &Request{}
	if err := parseRequestLine(line, r); err != nil {
		return nil, 0, err
	}
	off := len(b) - len(rest)
	fields, n, err := parseFields(b[off:])
	if err != nil {
		return nil, 0, err
	}
	off += n
	r.Fields = fields
	if err := r.checkHead(); err != nil {
		return nil, 0, err
	}
	te, cl := r.Get("Transfer-Encoding"), r.Get("Content-Length")
	switch {
	case len(te) > 0:
		r.Chunked = true
		body, trailers, n, err := parseChunked(b[off:])
		if err != nil {
			return nil, 0, err
		}
		r.Body, r.Trailers = body, trailers
		off += n
	case len(cl) > 0:
		size := parseLength(cl[0])
		if len(b)-off < size {
			return nil, 0, ErrIncomplete
		}
		r.Body = b[off : off+size]
		off += size
	}
	return r, off, nil
}

// crlfLine splits b at its first CRLF; a CR or LF alone is refused.
func crlfLine(b []byte) (line, rest []byte, err error) {
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '\n':
			return nil, nil, refuse("bare LF")
		case '\r':
			if i+1 == len(b) {
				return nil, nil, ErrIncomplete
			}
			if b[i+1] != '\n' {
				return nil, nil, refuse("bare CR")
			}
			return b[:i], b[i+2:], nil
		}
	}
	return nil, nil, ErrIncomplete
}

func parseRequestLine(line []byte, r *Request) error {
	if len(line) == 0 {
		return refuse("empty line before the request line")
	}
	parts := bytes.Split(line, []byte{' '})
	if len(parts) != 3 {
		return refuse("request line is not method SP target SP version: %q", line)
	}
	if !isToken(parts[0]) {
		return refuse("method %q is not a token", parts[0])
	}
	if len(parts[1]) == 0 {
		return refuse("empty request target")
	}
	for _, c := range parts[1] {
		if c <= ' ' || c >= 0x7f {
			return refuse("request target byte %#x", c)
		}
	}
	if bytes.IndexByte(parts[1], '#') >= 0 {
		return refuse("fragment in the request target")
	}
	switch string(parts[2]) {
	case "HTTP/1.1", "HTTP/1.0":
	default:
		return refuse("version %q", parts[2])
	}
	r.Method, r.Target, r.Version = string(parts[0]), string(parts[1]), string(parts[2])
	t := r.Target
	switch {
	case t[0] == '/':
	case r.Method == "CONNECT":
	case t == "*" && r.Method == "OPTIONS":
	case strings.HasPrefix(strings.ToLower(t), "http://"), strings.HasPrefix(strings.ToLower(t), "https://"):
	default:
		return refuse("request target %q has no form RFC 9112 knows", t)
	}
	return nil
}

// parseFields reads field lines up to and including the empty line.
func parseFields(b []byte) ([]Field, int, error) {
	var fields []Field
	off := 0
	for {
		line, rest, err := crlfLine(b[off:])
		if err != nil {
			return nil, 0, err
		}
		off = len(b) - len(rest)
		if len(line) == 0 {
			return fields, off, nil
		}
		f, err := parseField(line)
		if err != nil {
			return nil, 0, err
		}
		fields = append(fields, f)
		if len(fields) > 200 {
			return nil, 0, refuse("more than 200 fields")
		}
	}
}

func parseField(line []byte) (Field, error) {
	if line[0] == ' ' || line[0] == '\t' {
		return Field{}, refuse("obs-fold (a line starting with white space)")
	}
	name, value, ok := bytes.Cut(line, []byte{':'})
	if !ok {
		return Field{}, refuse("field line without a colon: %q", line)
	}
	if !isToken(name) {
		return Field{}, refuse("field name %q is not a token", name)
	}
	value = bytes.Trim(value, " \t")
	for _, c := range value {
		if c < ' ' && c != '\t' || c == 0x7f {
			return Field{}, refuse("control byte %#x in the value of %s", c, name)
		}
	}
	return Field{Name: string(name), Value: string(value)}, nil
}

// checkHead refuses what makes a head ambiguous: its framing, its Host.
func (r *Request) checkHead() error {
	hosts := r.Get("Host")
	if r.Version == "HTTP/1.1" && len(hosts) != 1 || len(hosts) > 1 {
		return refuse("%d Host fields", len(hosts))
	}
	te, cl := r.Get("Transfer-Encoding"), r.Get("Content-Length")
	if len(te) > 0 && len(cl) > 0 {
		return refuse("both Transfer-Encoding and Content-Length")
	}
	if len(te) > 0 {
		if r.Version != "HTTP/1.1" {
			return refuse("Transfer-Encoding in %s", r.Version)
		}
		if len(te) != 1 || !strings.EqualFold(te[0], "chunked") {
			return refuse("Transfer-Encoding %q: only one, chunked", te)
		}
	}
	if len(cl) > 1 {
		return refuse("%d Content-Length fields", len(cl))
	}
	if len(cl) == 1 && parseLength(cl[0]) < 0 {
		return refuse("Content-Length %q", cl[0])
	}
	conn := strings.ToLower(strings.Join(r.Get("Connection"), ","))
	tokens := map[string]bool{}
	for t := range strings.SplitSeq(conn, ",") {
		tokens[strings.TrimSpace(t)] = true
	}
	r.Close = tokens["close"] || r.Version == "HTTP/1.0" && !tokens["keep-alive"]
	return nil
}

// parseLength reads a Content-Length value: 1*DIGIT, at most 15 digits;
// -1 for anything else.
func parseLength(v string) int {
	if v == "" || len(v) > 15 {
		return -1
	}
	n := 0
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return -1
		}
		n = n*10 + int(v[i]-'0')
	}
	return n
}

// parseChunked reads a chunked body and its trailer section.
func parseChunked(b []byte) (body []byte, trailers []Field, n int, err error) {
	off := 0
	for {
		line, rest, err := crlfLine(b[off:])
		if err != nil {
			return nil, nil, 0, err
		}
		off = len(b) - len(rest)
		size, err := chunkSize(line)
		if err != nil {
			return nil, nil, 0, err
		}
		if size == 0 {
			trailers, n, err := parseFields(b[off:])
			if err != nil {
				return nil, nil, 0, err
			}
			for _, f := range trailers {
				switch strings.ToLower(f.Name) {
				case "transfer-encoding", "content-length", "host":
					return nil, nil, 0, refuse("%s in the trailer section", f.Name)
				}
			}
			return body, trailers, off + n, nil
		}
		if len(b)-off < size+2 {
			if len(b)-off > size && b[off+size] != '\r' {
				return nil, nil, 0, refuse("chunk data not followed by CRLF")
			}
			return nil, nil, 0, ErrIncomplete
		}
		body = append(body, b[off:off+size]...)
		if b[off+size] != '\r' || b[off+size+1] != '\n' {
			return nil, nil, 0, refuse("chunk data not followed by CRLF")
		}
		off += size + 2
	}
}

// chunkSize reads chunk-size [ chunk-ext ]: 1*HEXDIG, then extensions of
// the form *( BWS ";" BWS token [ BWS "=" BWS ( token / quoted-string ) ] ).
func chunkSize(line []byte) (int, error) {
	i, n := 0, 0
	for i < len(line) && isHex(line[i]) {
		n = n<<4 | unhex(line[i])
		i++
		if i > maxChunkDigits {
			return 0, refuse("chunk size of more than %d digits", maxChunkDigits)
		}
	}
	if i == 0 {
		return 0, refuse("chunk size %q", line)
	}
	ext := line[i:]
	for len(ext) > 0 {
		ext = bytes.TrimLeft(ext, " \t")
		if len(ext) == 0 || ext[0] != ';' {
			return 0, refuse("chunk extension %q", line[i:])
		}
		ext = bytes.TrimLeft(ext[1:], " \t")
		j := 0
		for j < len(ext) && isTchar(ext[j]) {
			j++
		}
		if j == 0 {
			return 0, refuse("chunk extension name in %q", line[i:])
		}
		ext = bytes.TrimLeft(ext[j:], " \t")
		if len(ext) == 0 || ext[0] != '=' {
			continue
		}
		ext = bytes.TrimLeft(ext[1:], " \t")
		if len(ext) > 0 && ext[0] == '"' {
			k, err := quotedString(ext)
			if err != nil {
				return 0, err
			}
			ext = ext[k:]
			continue
		}
		j = 0
		for j < len(ext) && isTchar(ext[j]) {
			j++
		}
		if j == 0 {
			return 0, refuse("chunk extension value in %q", line[i:])
		}
		ext = ext[j:]
	}
	return n, nil
}

func quotedString(b []byte) (int, error) {
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, nil
		case c == '\\':
			i++
			if i == len(b) || b[i] < ' ' && b[i] != '\t' || b[i] == 0x7f {
				return 0, refuse("quoted-pair in %q", b)
			}
		case c < ' ' && c != '\t' || c == 0x7f:
			return 0, refuse("control byte in quoted-string %q", b)
		}
	}
	return 0, refuse("unterminated quoted-string %q", b)
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func unhex(c byte) int {
	switch {
	case c <= '9':
		return int(c - '0')
	case c >= 'a':
		return int(c-'a') + 10
	}
	return int(c-'A') + 10
}

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !isTchar(c) {
			return false
		}
	}
	return true
}

// isTchar: RFC 9110's tchar.
func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// Stream is what the strict parser makes of one connection's bytes.
type Stream struct {
	Requests []*Request
	// Err is why parsing stopped before the end of the bytes (nil: every
	// byte was taken by a whole request); Rest the bytes not taken.
	Err  error
	Rest []byte
}

// ParseStream reads requests from b until it ends, a request asks the
// connection to close, or the parser refuses. Bytes after a closing
// request are Rest with an error saying so.
func ParseStream(b []byte) Stream {
	var s Stream
	for len(b) > 0 {
		r, n, err := ParseRequest(b)
		if err != nil {
			s.Err, s.Rest = err, b
			return s
		}
		s.Requests = append(s.Requests, r)
		b = b[n:]
		if r.Close && len(b) > 0 {
			s.Err, s.Rest = refuse("%d bytes after a request that closes the connection", len(b)), b
			return s
		}
	}
	return s
}
