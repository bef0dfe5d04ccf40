package ledger

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Kind names one fault of the fault layer. A request asks for a fault with
// the header
//
//	Ledger-Fault: <kind>[; times=N][; ms=N][; retry-after=N][; interim=1]
//
// times=N applies the fault to the first N arrivals of the request's
// Ledger-Id only (0 or absent: to every arrival), so a retry can succeed.
// ms=N is the hold time of KindHold and the idle time of KindCloseIdle.
// retry-after=N is the Retry-After (seconds) of KindStatus429. interim=1
// makes KindHold send an interim 100 Continue before it holds.
type Kind string

// The faults. Whether the ledger counts the request as executed is part of
// each fault's contract and is what Executes reports.
const (
	// KindNone serves the request normally (executed).
	KindNone Kind = "none"
	// KindResetBeforeRead resets the connection (HTTP/1.1: TCP RST; HTTP/2:
	// RST_STREAM INTERNAL_ERROR) once the request head arrived, without
	// reading the body. Not executed.
	KindResetBeforeRead Kind = "reset-before-read"
	// KindResetMidRequest reads about half of the request body and then
	// resets. For a request without a body it is KindResetBeforeRead.
	// Not executed.
	KindResetMidRequest Kind = "reset-mid-request"
	// KindResetAfterRead reads the whole request, executes it, and resets
	// before any byte of the answer. Executed.
	KindResetAfterRead Kind = "reset-after-read"
	// KindHold executes the request and holds the response headers for ms
	// (default 1000) before answering normally: longer than the caller's
	// per-attempt timeout. Executed.
	KindHold Kind = "hold"
	// KindCloseIdle answers normally (executed) on a keep-alive connection
	// without announcing a close, then closes the connection after ms of
	// idleness (default 0) with a FIN, the way servers drop idle
	// connections. A request that the client sends on it afterwards hits a
	// dead connection and is not executed.
	KindCloseIdle Kind = "close-idle"
	// KindResetOnReuse answers normally (executed), then resets the
	// connection as soon as the next request's first bytes arrive on it:
	// the close that races the client's reuse of a pooled connection. The
	// next request is not executed (counted as its Victim).
	KindResetOnReuse Kind = "reset-on-reuse"
	// KindStatus408, 425 and 429 answer that status without executing
	// (timeout, too early, rate limited: the server refused the work).
	KindStatus408 Kind = "408"
	KindStatus425 Kind = "425"
	KindStatus429 Kind = "429"
	// KindStatus500, 502, 503 and 504 execute the request and then answer
	// that status instead of the result: the worst case for a caller, who
	// cannot tell that the work was done. Executed.
	KindStatus500 Kind = "500"
	KindStatus502 Kind = "502"
	KindStatus503 Kind = "503"
	KindStatus504 Kind = "504"
	// KindResetMidBody executes, sends the response headers and half the
	// body, then resets. Executed.
	KindResetMidBody Kind = "reset-mid-body"
	// KindRefusedStream (HTTP/2 only) answers RST_STREAM REFUSED_STREAM as
	// soon as the request head arrives. Not executed.
	KindRefusedStream Kind = "refused-stream"
	// KindGoAway (HTTP/2 only) sends GOAWAY whose last-stream-id is below
	// the request's stream, finishes the streams below it and closes the
	// connection. Not executed.
	KindGoAway Kind = "goaway"
)

// Kinds lists every fault kind.
func Kinds() []Kind {
	return []Kind{KindNone, KindResetBeforeRead, KindResetMidRequest, KindResetAfterRead,
		KindHold, KindCloseIdle, KindResetOnReuse, KindStatus408, KindStatus425, KindStatus429,
		KindStatus500, KindStatus502, KindStatus503, KindStatus504, KindResetMidBody,
		KindRefusedStream, KindGoAway}
}

// Executes reports whether the ledger executes a request this fault applies
// to (a key replay is not an execution either way).
func (k Kind) Executes() bool {
	switch k {
	case KindNone, KindResetAfterRead, KindHold, KindCloseIdle, KindResetOnReuse,
		KindStatus500, KindStatus502, KindStatus503, KindStatus504, KindResetMidBody:
		return true
	}
	return false
}

// HTTP2Only reports whether the fault exists only on HTTP/2. On HTTP/1.1 the
// ledger answers such a request 400 without executing it.
func (k Kind) HTTP2Only() bool { return k == KindRefusedStream || k == KindGoAway }

// Status is the status a status fault answers, 0 for other kinds.
func (k Kind) Status() int {
	switch k {
	case KindStatus408, KindStatus425, KindStatus429, KindStatus500, KindStatus502,
		KindStatus503, KindStatus504:
		n, _ := strconv.Atoi(string(k))
		return n
	}
	return 0
}

// Fault is a parsed Ledger-Fault header.
type Fault struct {
	Kind Kind
	// Times: apply to the first Times arrivals of the id; 0 means always.
	Times int
	// Hold is KindHold's delay and KindCloseIdle's idle time.
	Hold time.Duration
	// RetryAfter is KindStatus429's Retry-After in seconds (-1: none).
	RetryAfter int
	// Interim (KindHold): a 100 Continue goes out before the hold, so that
	// the caller has the first bytes of an answer but no final header.
	Interim bool
}

// String renders the fault as a Ledger-Fault header value.
func (f Fault) String() string {
	if f.Kind == "" {
		return string(KindNone)
	}
	var b strings.Builder
	b.WriteString(string(f.Kind))
	if f.Times > 0 {
		fmt.Fprintf(&b, "; times=%d", f.Times)
	}
	if f.Hold > 0 {
		fmt.Fprintf(&b, "; ms=%d", f.Hold.Milliseconds())
	}
	if f.Kind == KindStatus429 && f.RetryAfter >= 0 {
		fmt.Fprintf(&b, "; retry-after=%d", f.RetryAfter)
	}
	if f.Interim {
		b.WriteString("; interim=1")
	}
	return b.String()
}

// ParseFault parses a Ledger-Fault header value; "" is KindNone.
func ParseFault(v string) (Fault, error) {
	f := Fault{Kind: KindNone, RetryAfter: -1}
	parts := strings.Split(v, ";")
	name := strings.TrimSpace(parts[0])
	if name == "" {
		name = string(KindNone)
	}
	known := false
	for _, k := range Kinds() {
		if string(k) == name {
			known = true
		}
	}
	if !known {
		return f, fmt.Errorf("unknown fault %q", name)
	}
	f.Kind = Kind(name)
	for _, p := range parts[1:] {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		k, val, ok := strings.Cut(p, "=")
		if !ok {
			return f, fmt.Errorf("fault parameter %q: want name=value", p)
		}
		n, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil || n < 0 {
			return f, fmt.Errorf("fault parameter %q: want a non-negative integer", p)
		}
		switch strings.TrimSpace(k) {
		case "times":
			f.Times = n
		case "ms":
			f.Hold = time.Duration(n) * time.Millisecond
		case "retry-after":
			f.RetryAfter = n
		case "interim":
			if n > 1 {
				return f, fmt.Errorf("fault parameter %q: want 0 or 1", p)
			}
			f.Interim = n == 1
		default:
			return f, fmt.Errorf("unknown fault parameter %q", k)
		}
	}
	if f.Kind == KindHold && f.Hold == 0 {
		f.Hold = time.Second
	}
	if f.Interim && f.Kind != KindHold {
		return f, fmt.Errorf("fault parameter interim: only for %s", KindHold)
	}
	return f, nil
}
