package retry

import (
	"fmt"
	"strings"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/attempt"
)

// Explain tells the request's story, one line per attempt, for people
// (`egret explain`): how far each attempt got, what the evidence was and
// why, what the engine decided, and what the caller was told.
func (t *Trace) Explain() string {
	var b strings.Builder
	idem := "not idempotent"
	if t.Idempotent {
		idem = "idempotent"
	}
	fmt.Fprintf(&b, "%s %s -> %s (%s, body %s)\n", t.Method, t.URL, t.Upstream, idem, t.Body)
	if t.Note != "" {
		fmt.Fprintf(&b, "  note: %s\n", t.Note)
	}
	for _, a := range t.Attempts {
		fmt.Fprintf(&b, "  #%d %s reached %s: ", a.N, a.Duration.Round(time.Microsecond), a.Stage)
		if a.Endpoint != "" {
			fmt.Fprintf(&b, "endpoint %s, ", a.Endpoint)
		}
		if a.Failure == engine.CategoryNone {
			fmt.Fprintf(&b, "status %d", a.Status)
			if a.RuleStatus != 0 {
				fmt.Fprintf(&b, " (gRPC Trailers-Only, read as %d)", a.RuleStatus)
			}
		} else {
			fmt.Fprintf(&b, "%s", a.Failure)
			if a.Status != 0 {
				fmt.Fprintf(&b, " after status %d", a.Status)
			}
		}
		fmt.Fprintf(&b, ", evidence %s", a.Evidence)
		wb, wa := a.WitnessBefore, a.WitnessAfter
		switch {
		case a.Upgraded && a.Proof == ProofEndedBeforeAck:
			fmt.Fprintf(&b, " (witness %s: %d bytes sent, acked %d before and after: the upstream's FIN acked none, then it reset them)",
				wa.Source, wa.BytesSent-wb.BytesSent, wa.BytesAcked)
		case a.Upgraded:
			fmt.Fprintf(&b, " (witness %s: %d bytes / %d segments sent before and after)",
				wa.Source, wa.BytesSent, wa.DataSegsOut)
		case wa.Source != "":
			fmt.Fprintf(&b, " (witness %s: sent %d -> %d, acked %d -> %d)", wa.Source, wb.BytesSent, wa.BytesSent,
				wb.BytesAcked, wa.BytesAcked)
		}
		if a.Reused {
			fmt.Fprintf(&b, ", on a connection idle %s", a.Idle.Round(time.Microsecond))
		}
		if a.IdleBound.Source != attempt.IdleBoundNone {
			fmt.Fprintf(&b, ", idle bound %s (%s %s)", a.IdleBound.Limit.Round(time.Microsecond),
				a.IdleBound.Source, a.IdleBound.Seen.Round(time.Microsecond))
		}
		if a.HiddenRetries > 0 {
			fmt.Fprintf(&b, ", %d connection(s) replaced by net/http", a.HiddenRetries)
		}
		fmt.Fprintf(&b, "; %s", a.Decision.Decision)
		if a.Decision.Reason != engine.ReasonNone {
			fmt.Fprintf(&b, " (%s)", a.Decision.Reason)
		}
		if a.Decision.Decision == engine.Retry {
			fmt.Fprintf(&b, " after %s", a.Decision.Wait.Round(time.Microsecond))
		}
		if a.BudgetRead {
			fmt.Fprintf(&b, ", budget %.1f", a.Budget)
		}
		if a.Err != "" {
			fmt.Fprintf(&b, "; error: %s", a.Err)
		}
		b.WriteByte('\n')
	}
	switch t.Outcome {
	case engine.OutcomeNone:
		b.WriteString("  => the response was relayed\n")
	case engine.OutcomeAmbiguous:
		b.WriteString("  => ambiguous: the request may have been executed\n")
	default:
		fmt.Fprintf(&b, "  => %s\n", t.Outcome)
	}
	return b.String()
}
