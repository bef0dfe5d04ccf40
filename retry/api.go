// Package retry applies egret's retry engine to HTTP requests: it runs a
// request's attempts, gathers the evidence of each (stage reached,
// transport error, kernel witness), asks engine.Decide, waits, and tells
// the truth when it stops.
//
// One call is the seam, and one call ends it: Runner.Run takes one
// Exchange (the request, its policy, the base transport, the header field
// order, the bulkhead) and returns one Result (a response or an error, and
// the trace with the engine's outcome); Result.Finish, once the response's
// body is done with, completes the run and returns the final trace. The
// node proxy calls both once per request; Transport, an
// http.RoundTripper, makes the Exchange for Go programs and ends the run
// at the body's end.
//
// The pieces:
//   - Runner, Exchange, Transport (transport.go): the attempt loop,
//     budget, waits, bodies, the response's first-chunk peek, outcomes
//     (*Error, *AmbiguousError).
//   - classify.go: evidence from the attempt's progress and the error, and
//     the witness's before/after snapshots.
//   - client.HTTPTransport (package retry/client): the one-attempt Base, handed each
//     attempt by the runner (Send): its own HTTP/1.1 client, and
//     HTTP/2 (h2c prior knowledge, ALPN h2) on its own pool of net/http
//     connections, so that nothing is replayed behind the engine's back.
//   - retry/attempt: the contract between the loop and the client: the
//     attempt's context and trace, and attempt.Conn, the upstream socket
//     wrapper that freezes at a failure so that the kernel's counters can
//     prove not_sent.
//
// Use:
//
//	client := &http.Client{Transport: &retry.Transport{
//		Base:    client.NewHTTPTransport(client.HTTPOptions{HTTP2: true}),
//		Witness: witness.TCPInfo{},
//	}}
//	resp, err := client.Post(url, "application/json", bytes.NewReader(b))
//	if errors.Is(err, retry.ErrAmbiguous) { /* reconcile: it may have run */ }
package retry

import (
	"context"
	"net/http"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/witness"
)

// Policy is what one request's upstream allows. The proxy builds it from the
// policy file; a Go program sets it on the Transport.
type Policy struct {
	// Upstream names the retry budget (node-wide, per upstream), e.g.
	// "api.example.com:443".
	Upstream    string
	MaxAttempts int
	// Timeout bounds the whole request, waits included (0: none).
	// AttemptTimeout bounds one attempt up to its final response headers
	// (0: none). MinAttempt is the least time worth starting an attempt in.
	Timeout        time.Duration
	AttemptTimeout time.Duration
	MinAttempt     time.Duration
	Backoff        engine.Backoff
	Budget         engine.BudgetConfig
	// TransientStatuses are 5xx statuses (other than 502-504) to retry for
	// idempotent requests.
	TransientStatuses []int
	// Idempotency resolves "safely idempotent" for this request (route
	// already matched by the caller).
	Idempotency engine.Idempotency
	// Refresh, when set, refreshes the credential after a 401 and rewrites
	// the request's credentials; it is used at most once a request.
	Refresh func(ctx context.Context, req *http.Request) error
}

// DefaultPolicy follows the spec's simulate defaults: 3 attempts, full
// jitter 25 ms to 1 s, minimum attempt 50 ms, budget 0.2 / 10 a second /
// 10 s, and a 15 s overall timeout.
func DefaultPolicy(upstream string) Policy {
	return Policy{
		Upstream:    upstream,
		MaxAttempts: engine.DefaultMaxAttempts,
		Timeout:     15 * time.Second,
		MinAttempt:  engine.DefaultMinAttempt,
		Backoff:     engine.DefaultBackoff,
		Budget:      engine.DefaultBudget,
	}
}

// Stage is how far an attempt got before it ended.
type Stage uint8

const (
	StagePool Stage = iota + 1 // waiting for a connection or a bulkhead permit
	StageDNS
	StageConnect
	StageTLS
	StageWrite    // writing the request
	StageHeaders  // waiting for final response headers
	StageBody     // reading the response body
	StageComplete // the attempt ended with a response
)

func (s Stage) String() string {
	switch s {
	case StagePool:
		return "pool"
	case StageDNS:
		return "dns"
	case StageConnect:
		return "connect"
	case StageTLS:
		return "tls"
	case StageWrite:
		return "write"
	case StageHeaders:
		return "headers"
	case StageBody:
		return "body"
	case StageComplete:
		return "complete"
	}
	return "unknown"
}

// Attempt is the record of one attempt, kept for `egret explain`.
type Attempt struct {
	N        int
	Start    time.Time
	Duration time.Duration
	Stage    Stage
	Failure  engine.Category // CategoryNone when a response arrived
	// Evidence is what the decision used; Upgraded says the kernel witness
	// proved not_sent for a stage that alone gave sent_no_response.
	Evidence engine.Evidence
	Upgraded bool
	// Proof says which proof the witness gave when Upgraded.
	Proof Proof
	// WitnessBefore/After are the upstream socket's counters when the
	// request write started and when the attempt failed (zero if none).
	WitnessBefore, WitnessAfter witness.Counters
	// Reused: the attempt went on a pooled connection, idle for Idle.
	// attempt.IdleBound is the upstream's bound the pool applied to a request that
	// is not safely idempotent (Source none: nothing learned, or the
	// request is idempotent and any live connection does).
	Reused    bool
	Idle      time.Duration
	IdleBound attempt.IdleBound
	Status    int
	// RuleStatus is the status the rules read when it is not Status: a
	// gRPC call's Trailers-Only UNAVAILABLE (503) or RESOURCE_EXHAUSTED
	// (429) answer, for an idempotent call (grpcRule); 0 otherwise.
	RuleStatus int
	Err        string
	Decision   engine.Result
	// Budget is the upstream's retry tokens when the decision was taken,
	// if it consulted them (BudgetRead: a success never does).
	Budget     float64
	BudgetRead bool
	// HiddenRetries counts connections net/http moved to inside this
	// attempt (its own replay of a request on a pooled connection that
	// died) after bytes of the request left on the previous one: each is
	// a dispatch the upstream may have seen. The evidence then never
	// claims not_sent; see Transport. A move after a write that failed
	// before its first byte (net/http's "nothing written") is not one.
	HiddenRetries int
	// Endpoint is the address the attempt dialled when the exchange chose
	// among several (Exchange.Endpoints); empty otherwise.
	Endpoint string
}

// Trace is the short history of one request.
type Trace struct {
	RequestID  string
	Method     string
	URL        string
	Upstream   string
	Idempotent bool
	Body       engine.Body
	Start      time.Time
	Attempts   []Attempt
	Outcome    engine.Outcome
	// Note is the caller's word on how the upstream was handled (the
	// proxy's: a Kubernetes Service egret leaves to kube-proxy).
	Note string
}

// Proof is how the kernel witness proved not_sent.
type Proof uint8

const (
	ProofNone Proof = iota
	// ProofNoByteLeft: no byte of the request left the host
	// (witness.NoByteLeft).
	ProofNoByteLeft
	// ProofEndedBeforeAck: bytes left, but the upstream's FIN acked none
	// of them and it reset them (witness.EndedBeforeAck).
	ProofEndedBeforeAck
)

func (p Proof) String() string {
	switch p {
	case ProofNoByteLeft:
		return "no_byte_left"
	case ProofEndedBeforeAck:
		return "ended_before_ack"
	}
	return "none"
}
