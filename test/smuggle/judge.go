package smuggle

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Logged is one request as the proxy under test logged it.
type Logged struct {
	ID, Method, URL string
	Attempts        int
	// Outcome: egret's (relayed, rejected, not-sent, failed, ambiguous,
	// upgrade, tunnel, forward_proxy); HAProxy's lines are mapped to
	// relayed or rejected.
	Outcome string
	Status  int
	// Err is why the proxy refused or failed it, as it logged it.
	Err string
}

// Pipe outcomes: the proxy declares that it stopped parsing and carries
// the connection byte for byte from that request on (transparent mode:
// the pod speaks to its own forward proxy). An upgrade is not one: it may
// become a pipe only after the upstream's 101, which this upstream never
// sends.
var pipeOutcomes = map[string]bool{"forward_proxy": true, "tunnel": true}

// Class of a verdict.
const (
	Refused   = "refused"   // the proxy refused part of the stream (4xx/5xx of its own, or a close)
	Forwarded = "forwarded" // every request was forwarded and parses as logged
	Piped     = "piped"     // a declared byte-for-byte pipe carried the bytes exactly
	Desync    = "desync"    // the upstream read something the proxy did not log
)

// Verdict is the judgement of one case.
type Verdict struct {
	Class   string
	Reasons []string
	// Upstream is what the strict parser read at the upstream, request by
	// request ("METHOD target"), for the report.
	Upstream []string
}

// HeaderRequestID correlates a forwarded request with its log line.
const HeaderRequestID = "Egret-Request-Id"

// Judge decides a case: client is every byte the client sent; logs the
// proxy's lines for the connection; conns the bytes each upstream
// connection received; passthrough says the proxy reported passing the
// connection through unparsed (a sniffed non-HTTP protocol). What the
// upstream received must parse, under the strict parser, to exactly the
// requests the proxy logged as forwarded (each at most as often as its
// attempts), or be a declared pipe carrying the client's bytes unchanged.
func Judge(client []byte, logs []Logged, conns [][]byte, passthrough bool) Verdict {
	return JudgeWith(client, logs, conns, passthrough, HeaderRequestID, true)
}

// JudgeWith is Judge for a proxy that marks forwarded requests with
// idHeader; egretFields also holds it to egret's rule that no client-sent
// Egret-* field reaches the upstream (not asked of other proxies).
func JudgeWith(client []byte, logs []Logged, conns [][]byte, passthrough bool, idHeader string, egretFields bool) Verdict {
	var v Verdict
	fail := func(format string, a ...any) { v.Reasons = append(v.Reasons, fmt.Sprintf(format, a...)) }

	var forwarded []*Logged
	rejected, piped := false, passthrough
	for i := range logs {
		l := &logs[i]
		switch {
		case l.Outcome == "rejected" || l.Attempts == 0:
			rejected = true
		case pipeOutcomes[l.Outcome]:
			piped = true
			forwarded = append(forwarded, l)
		default:
			forwarded = append(forwarded, l)
		}
	}
	arrivals := map[*Logged]int{}
	pipeSeen := false
	for i, b := range conns {
		if len(b) == 0 {
			continue
		}
		if piped && !pipeSeen && bytes.HasSuffix(client, b) {
			// The pipe: the client's bytes from some point on, unchanged.
			pipeSeen = true
			if l := pipeLog(forwarded); l != nil {
				arrivals[l]++
			}
			v.Upstream = append(v.Upstream, fmt.Sprintf("conn %d: %d bytes piped", i, len(b)))
			continue
		}
		s := ParseStream(b)
		for _, r := range s.Requests {
			v.Upstream = append(v.Upstream, fmt.Sprintf("conn %d: %s %s", i, r.Method, r.Target))
			l := match(forwarded, arrivals, r, idHeader)
			if l == nil {
				fail("conn %d: the upstream read %s %s (%s %q), which the proxy did not log", i, r.Method, r.Target,
					idHeader, r.Get(idHeader))
				continue
			}
			arrivals[l]++
			if !egretFields {
				continue
			}
			if bad := forgedFields(r, l); len(bad) > 0 {
				fail("conn %d: %s %s reached the upstream with %q (egret logged id %s)", i, r.Method, r.Target, bad, l.ID)
			}
		}
		switch {
		case s.Err == nil:
		case errors.Is(s.Err, ErrIncomplete):
			fail("conn %d: the upstream was left inside a request: %q", i, clip(s.Rest))
		default:
			fail("conn %d: %v, at %q", i, s.Err, clip(s.Rest))
		}
	}
	if piped && passthrough && !pipeSeen && len(conns) > 0 {
		fail("passed through, but no upstream connection carried the client's bytes unchanged")
	}
	for _, l := range forwarded {
		n := arrivals[l]
		if n > max(l.Attempts, 1) {
			fail("%s %s (id %s) reached the upstream %d times, logged with %d attempts", l.Method, l.URL, l.ID, n, l.Attempts)
		}
		if n == 0 && (l.Outcome == "relayed" || pipeOutcomes[l.Outcome]) {
			fail("%s %s (id %s) logged %s, but the upstream never read it", l.Method, l.URL, l.ID, l.Outcome)
		}
	}
	switch {
	case len(v.Reasons) > 0:
		v.Class = Desync
	case piped:
		v.Class = Piped
	case rejected || len(forwarded) == 0:
		// Refused with an answer of its own, or closed without forwarding.
		v.Class = Refused
	default:
		v.Class = Forwarded
	}
	return v
}

func pipeLog(forwarded []*Logged) *Logged {
	for _, l := range forwarded {
		if pipeOutcomes[l.Outcome] {
			return l
		}
	}
	return nil
}

// match finds the log line of an upstream request: by its request id when
// it carries exactly one that the proxy logged, else the first line not yet
// matched with the same method and target.
func match(forwarded []*Logged, arrivals map[*Logged]int, r *Request, idHeader string) *Logged {
	if ids := r.Get(idHeader); len(ids) == 1 {
		for _, l := range forwarded {
			if l.ID == ids[0] {
				if l.Method != r.Method || target(l.URL) != target(r.Target) {
					return nil
				}
				return l
			}
		}
	}
	for _, l := range forwarded {
		if arrivals[l] == 0 && !pipeOutcomes[l.Outcome] && l.Method == r.Method && target(l.URL) == target(r.Target) {
			return l
		}
	}
	return nil
}

// target reduces a logged URL or a request target to its path and query:
// an origin-form target as it is, an absolute URL to its request URI.
func target(s string) string {
	if strings.HasPrefix(s, "/") {
		return s
	}
	if u, err := url.Parse(s); err == nil && u.Scheme != "" {
		return u.RequestURI()
	}
	return s
}

// forgedFields says what egret fields of r the upstream must not see: a
// request id other than l's (a client's forgery, or two), and any other
// Egret-* field (egret's answers' fields, or an input it should have
// taken): an upstream must never see a pod's forged egret fields.
func forgedFields(r *Request, l *Logged) []string {
	var bad []string
	ids := 0
	for _, f := range r.Fields {
		if !strings.HasPrefix(strings.ToLower(f.Name), "egret-") {
			continue
		}
		if strings.EqualFold(f.Name, HeaderRequestID) {
			ids++
			if f.Value == l.ID && ids == 1 {
				continue
			}
		}
		bad = append(bad, f.Name+": "+f.Value)
	}
	return bad
}

func clip(b []byte) string {
	if len(b) > 120 {
		return string(b[:120]) + "..."
	}
	return string(b)
}
