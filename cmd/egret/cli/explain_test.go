package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry"
	"github.com/egret-proxy/egret/witness"
)

// TestExplainShowsKernelEvidenceAndIdleBound: egret explain of a POST the
// witness proved not sent (the upstream's FIN acked none of it) shows the
// acked bytes before and after, the proof, the pooled connection's idle
// time and the upstream's idle bound with its source.
func TestExplainShowsKernelEvidenceAndIdleBound(t *testing.T) {
	c := func(sent, acked, recv uint64, state uint8) witness.Counters {
		return witness.Counters{BytesSent: sent, HasBytesSent: true, BytesAcked: acked, HasBytesAcked: true,
			BytesReceived: recv, HasBytesReceived: true, State: state, Source: "tcp_info"}
	}
	tr := retry.Trace{RequestID: "8e13ac3b035fce95", Method: "POST", URL: "http://api/pay", Upstream: "api:80",
		Attempts: []retry.Attempt{{
			N: 1, Stage: retry.StageHeaders, Failure: engine.ConnectionReset, Evidence: engine.NotSent,
			Upgraded: true, Proof: retry.ProofEndedBeforeAck,
			WitnessBefore: c(65, 66, 40, witness.StateEstablished), WitnessAfter: c(131, 66, 41, witness.StateClose),
			Reused: true, Idle: 600 * time.Millisecond,
			IdleBound: retry.IdleBound{Limit: 750 * time.Millisecond, Seen: time.Second, Source: retry.IdleBoundKeepAlive},
			Decision:  engine.Result{Decision: engine.Retry, Reason: engine.ReasonNotSent},
		}}}
	var b strings.Builder
	writeExplain(&b, agent.ViewTrace(tr))
	out := b.String()
	for _, want := range []string{
		"evidence not_sent (upgraded by the witness: the upstream's FIN acked no byte of the request, then it reset them)",
		"bytes sent 65 -> 131",
		"acked 66 -> 66",
		"connection: a pooled connection idle 600.0 ms; idle bound 750.0 ms for requests that are not idempotent (keep-alive timeout: 1000.0 ms)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
}
