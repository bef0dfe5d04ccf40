package truth

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/egret-proxy/egret/test/ledger"
)

// idleCell is one cell of TestIdleReuse: a request of method sent on the
// pooled connection a priming request left behind with the fault prime.
type idleCell struct {
	target target
	prime  ledger.Kind
	method string
	// fault is the fault of the request under test itself (the control:
	// reset-after-read on a reused connection, which executes).
	fault ledger.Kind
}

func (c idleCell) String() string {
	s := fmt.Sprintf("%s %s after %s", c.target, c.method, c.prime)
	if c.fault != ledger.KindNone {
		s += " with " + string(c.fault)
	}
	return s
}

// idleCount is what one cell's answers were.
type idleCount struct {
	ok, ambiguous, notSent, other int
	// duplicates counts requests the ledger executed more than once;
	// falseNotSent those answered not-sent that the ledger received.
	duplicates, falseNotSent int
}

// TestIdleReuse sends, 20 times a cell, a request of each method on the
// keep-alive connection that a priming request to the same upstream left
// in egret's pool, where the upstream closes that connection once idle
// (close-idle: FIN right after the answer, h1; GOAWAY on h2c) or resets it
// as the next request arrives (reset-on-reuse). The request under test
// reaches no application in those cases: egret must never run it twice,
// never call not-sent what the upstream received, and (issue 28) should
// not answer ambiguous where the upstream acked no byte of it. The last
// cell is the control: a POST on a reused connection whose upstream reads
// it, executes it and resets; it must be answered ambiguous, every time.
func TestIdleReuse(t *testing.T) {
	u := startUpstreams(t)
	const n = 20
	// The control: while egret knows nothing of the upstream it reuses a
	// connection for a POST.
	cells := []idleCell{{targetH1, ledger.KindNone, "POST", ledger.KindResetAfterRead}}
	for _, tg := range []target{targetH1, targetH2C} {
		for _, prime := range []ledger.Kind{ledger.KindCloseIdle, ledger.KindResetOnReuse} {
			for _, m := range []string{"POST", "PUT", "PATCH"} {
				cells = append(cells, idleCell{tg, prime, m, ledger.KindNone})
			}
		}
	}
	var report strings.Builder
	for ci, cell := range cells {
		// An egret of its own a cell: it starts knowing nothing of the
		// upstream, so each cell pays for what egret must learn.
		egret, traces := startEgret(t, u.policyFor(truthDefaults))
		c := client(egret, 1)
		explain := explainer(traces)
		var cnt idleCount
		for i := range n {
			prime := spec{n: i, id: fmt.Sprintf("idle%02d-%02d-prime", ci, i), target: cell.target, method: "GET",
				fault: ledger.Fault{Kind: cell.prime, RetryAfter: -1}}
			if a := do(c, u.request(prime)); a.err != nil || a.status != 200 {
				t.Fatalf("%s: priming request %d: %v status %d outcome %q", cell, i, a.err, a.status, a.outcome)
			}
			// No wait: the upstream's FIN (or GOAWAY) races the next
			// request, as a pod's next POST races a real upstream's idle
			// timer.
			s := spec{n: i, id: fmt.Sprintf("idle%02d-%02d", ci, i), target: cell.target, method: cell.method,
				size: 100, fault: ledger.Fault{Kind: cell.fault, RetryAfter: -1}}
			a := do(c, u.request(s))
			rec := u.ledger.Records()[s.id]
			execs := len(rec.Executions)
			if execs > 1 {
				cnt.duplicates++
				t.Errorf("%s #%d: executed %d times\n      %s", cell, i, execs, explain(a.requestID))
			}
			switch {
			case a.err != nil:
				cnt.other++
				t.Errorf("%s #%d: no answer: %v", cell, i, a.err)
			case a.outcome == "ambiguous":
				cnt.ambiguous++
				t.Logf("%s #%d: ambiguous\n      %s", cell, i, explain(a.requestID))
			case a.outcome == "not-sent":
				cnt.notSent++
				if execs > 0 || rec.Arrivals > 0 {
					cnt.falseNotSent++
					t.Errorf("%s #%d: not-sent, but the ledger received it (%d arrivals, %d executions)\n      %s",
						cell, i, rec.Arrivals, execs, explain(a.requestID))
				}
			case a.status == http.StatusOK && a.outcome == "":
				cnt.ok++
				if execs != 1 {
					t.Errorf("%s #%d: 200 with %d executions", cell, i, execs)
				}
			default:
				cnt.other++
				t.Logf("%s #%d: status %d outcome %q\n      %s", cell, i, a.status, a.outcome, explain(a.requestID))
			}
			if cell.fault == ledger.KindResetAfterRead && a.outcome != "ambiguous" {
				t.Errorf("%s #%d: want ambiguous (the upstream executed it, then reset), got status %d outcome %q\n      %s",
					cell, i, a.status, a.outcome, explain(a.requestID))
			}
		}
		fmt.Fprintf(&report, "  %-42s 200 %2d  ambiguous %2d  not-sent %2d  other %2d  duplicates %d  false not-sent %d\n",
			cell, cnt.ok, cnt.ambiguous, cnt.notSent, cnt.other, cnt.duplicates, cnt.falseNotSent)
		c.CloseIdleConnections()
	}
	t.Logf("%d requests a cell, each after a priming request on the same upstream:\n%s", n, report.String())
}
