package policy

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors; every error Parse, Load and Overlay return wraps one or
// more of them (match with errors.Is) inside *Error values that say where.
var (
	// ErrSyntax: the file is not well-formed YAML, or not one document.
	ErrSyntax = errors.New("yaml syntax error")
	// ErrUnknownField: a key the schema does not define (or a key that
	// is not allowed where it stands, such as credential under defaults).
	ErrUnknownField = errors.New("unknown field")
	// ErrDuplicate: a key given twice in one mapping, two upstreams with the
	// same host and port, or two routes with the same method and prefix.
	ErrDuplicate = errors.New("duplicate")
	// ErrInvalid: a value of the wrong type, out of range or malformed.
	ErrInvalid = errors.New("invalid value")
	// ErrConflict: values that are valid alone but contradict each other,
	// such as an attempt timeout longer than the overall timeout.
	ErrConflict = errors.New("conflicting values")
	// ErrFile: a file the policy names (TLS material, a token) cannot be
	// read or used.
	ErrFile = errors.New("unusable file")
	// ErrNotOverridable: a per-pod override sets a field only the node's
	// policy may set (name, budget, bulkhead, body limits, tls, credential).
	ErrNotOverridable = errors.New("not overridable")
	// ErrEmpty: a Watcher was given a policy file with no document in it
	// (nothing, blanks or comments only: a file caught mid-write, or
	// truncated). It is not taken for "every default": a policy of
	// defaults only says so, e.g. `defaults: {}`.
	ErrEmpty = errors.New("empty policy file")
)

// maxErrors bounds how many problems one parse reports.
const maxErrors = 20

// Error is one problem in a policy file, at a line and column.
type Error struct {
	File   string
	Line   int // 1-based; 0 when unknown
	Column int // 1-based; 0 when unknown
	// Path is the field, e.g. "upstreams[1].backoff.kind" (empty for
	// problems of the whole file).
	Path string
	Msg  string
	Err  error // the sentinel
}

// Error formats as "file:line:column: path: message".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }

// Errors is every problem found in one file, in file order. errors.Is and
// errors.As see each of them.
type Errors []*Error

// Error lists the problems one a line.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the problems for errors.Is and errors.As.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}
