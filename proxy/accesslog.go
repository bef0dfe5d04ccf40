package proxy

import (
	"fmt"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry"
)

// AccessLog says which requests a Server logs (one line each, at Info).
type AccessLog uint8

const (
	// AccessLogAll logs every request (the zero value).
	AccessLogAll AccessLog = iota
	// AccessLogErrors logs the requests that did not simply succeed: any
	// retried (more than one dispatch), denied a retry for a reason other
	// than the status rules (budget_exhausted, max_attempts, deadline,
	// ...), answered ambiguous, not-sent, failed or rejected, answered
	// with a 5xx status, or cut while relayed. A 2xx-4xx answered at the
	// first attempt, a tunnel and an upgrade are not logged.
	AccessLogErrors
	// AccessLogOff logs no request.
	AccessLogOff
)

func (a AccessLog) String() string {
	switch a {
	case AccessLogAll:
		return "all"
	case AccessLogErrors:
		return "errors"
	case AccessLogOff:
		return "off"
	}
	return fmt.Sprintf("AccessLog(%d)", uint8(a))
}

// ParseAccessLog reads "all", "errors" or "off".
func ParseAccessLog(s string) (AccessLog, error) {
	for _, a := range []AccessLog{AccessLogAll, AccessLogErrors, AccessLogOff} {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("%w: access log %q: expected all, errors or off", ErrConfig, s)
}

// reasonNone is the reason logged when no decision was taken (a request
// refused before any attempt, a tunnel, an upgrade).
const reasonNone = "none"

// lastDecision is the reason of the last decision of a request's trace
// ("none" without one) and whether it denied a retry for a reason other
// than the status rules.
func lastDecision(tr *retry.Trace) (reason string, denied bool) {
	if tr == nil || len(tr.Attempts) == 0 {
		return reasonNone, false
	}
	d := tr.Attempts[len(tr.Attempts)-1].Decision
	reason = d.Reason.String()
	if reason == "" {
		reason = reasonNone
	}
	denied = d.Decision == engine.Deny && d.Reason != engine.ReasonNone && d.Reason != engine.ReasonStatus
	return reason, denied
}

// logged reports whether l is logged under a.
func (a AccessLog) logged(l *requestLog) bool {
	switch a {
	case AccessLogOff:
		return false
	case AccessLogErrors:
		switch l.outcome {
		case labelRelayed, "tunnel", "upgrade":
		default:
			return true
		}
		return l.attempts > 1 || l.denied || l.status >= 500 || l.err != "" || l.e != nil
	}
	return true
}
