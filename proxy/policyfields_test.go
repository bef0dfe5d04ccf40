package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry"
	"github.com/egret-proxy/egret/test/ledger"
)

// The policy fields whose effect TestEveryPolicyFieldActs shows through a
// real proxy and a real ledger upstream. tls, credential,
// inject_idempotency_key, bulkhead and body have tests of their own
// (upstream_test.go, retry_test.go, body_test.go).

// fieldDefaults is the defaults block of every policy below: short waits,
// a generous budget, so that only the field a row sets decides.
const fieldDefaults = `defaults:
  max_attempts: 3
  timeout: 5s
  min_attempt: 10ms
  backoff: {kind: full, base: 1ms, max: 5ms}
  budget: {ratio: 1, min_per_second: 1000, ttl: 10s}
`

// fieldPolicy is a policy whose entry for the ledger's host (any port)
// holds the given lines: the row's field, and whatever it needs besides.
func fieldPolicy(lines ...string) string {
	var b strings.Builder
	b.WriteString(fieldDefaults)
	b.WriteString("upstreams:\n  - host: 127.0.0.1\n")
	for _, l := range lines {
		for _, s := range strings.Split(l, "\n") {
			b.WriteString("    " + s + "\n")
		}
	}
	return b.String()
}

// fieldRig is one egret proxy (explicit mode, loopback) under one policy,
// in front of a ledger of its own, with a budget store of its own.
type fieldRig struct {
	t      *testing.T
	doc    string
	led    *ledger.Server
	up     string // the ledger's host:port
	p      *testProxy
	client *http.Client
	n      atomic.Int64
}

func newFieldRig(t *testing.T, doc string) *fieldRig {
	t.Helper()
	led, addr := ledger.Start(t)
	p := startProxy(t, Config{Mode: Explicit, Policy: mustPolicy(t, doc)})
	c := p.client()
	t.Cleanup(c.CloseIdleConnections)
	return &fieldRig{t: t, doc: doc, led: led, up: addr.String(), p: p, client: c}
}

// fieldAnswer is what one request showed: the proxy's answer, the
// ledger's record of it and the runner's trace.
type fieldAnswer struct {
	status   int
	attempts int    // Egret-Attempts
	outcome  string // Egret-Outcome
	header   http.Header
	rec      ledger.Record
	tr       retry.Trace
	elapsed  time.Duration
}

// do sends one request through the proxy to the ledger, asking for fault
// (none when empty), and collects what it showed.
func (r *fieldRig) do(method, path, fault string, hdr http.Header, body string) fieldAnswer {
	t := r.t
	t.Helper()
	lid := fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "."), r.n.Add(1))
	var rb io.Reader
	if body != "" {
		rb = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+r.up+path, rb)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	req.Header.Set(ledger.HeaderID, lid)
	if fault != "" {
		req.Header.Set(ledger.HeaderFault, fault)
	}
	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s (fault %q): %v", method, path, fault, err)
	}
	readAll(t, resp.Body)
	resp.Body.Close()
	a := fieldAnswer{status: resp.StatusCode, outcome: resp.Header.Get(HeaderOutcome), header: resp.Header, elapsed: time.Since(start)}
	if a.attempts, err = strconv.Atoi(resp.Header.Get(HeaderAttempts)); err != nil {
		t.Fatalf("%s = %q", HeaderAttempts, resp.Header.Get(HeaderAttempts))
	}
	id := resp.Header.Get(HeaderRequestID)
	tr, ok := waitTrace(r.p, id)
	if !ok {
		t.Fatalf("no trace for request %s", id)
	}
	a.tr = tr
	a.rec = r.led.Record(lid)
	return a
}

// reasons lists the trace's decisions as "decision/reason", one per attempt.
func (a fieldAnswer) reasons() []string {
	var s []string
	for _, at := range a.tr.Attempts {
		s = append(s, at.Decision.Decision.String()+"/"+at.Decision.Reason.String())
	}
	return s
}

func (a fieldAnswer) String() string {
	return fmt.Sprintf("status %d, Egret-Attempts %d, Egret-Outcome %q, ledger arrivals %d executions %d replays %d, decisions %v",
		a.status, a.attempts, a.outcome, a.rec.Arrivals, len(a.rec.Executions), a.rec.Replays, a.reasons())
}

// expect checks an answer's status, Egret-Attempts, Egret-Outcome and
// ledger arrivals (arrivals < 0: not checked), and that the trace has one
// entry per attempt.
func expect(t *testing.T, what string, a fieldAnswer, status, attempts int, outcome string, arrivals int) {
	t.Helper()
	if a.status != status || a.attempts != attempts || a.outcome != outcome ||
		(arrivals >= 0 && a.rec.Arrivals != arrivals) || len(a.tr.Attempts) != a.attempts {
		t.Errorf("%s: %v; want status %d, %d attempts, outcome %q, %d arrivals", what, a, status, attempts, outcome, arrivals)
	}
}

// lastReason is the reason of the trace's last decision.
func (a fieldAnswer) lastReason() string {
	if len(a.tr.Attempts) == 0 {
		return ""
	}
	return a.tr.Attempts[len(a.tr.Attempts)-1].Decision.Reason.String()
}

func TestEveryPolicyFieldActs(t *testing.T) {
	ms := time.Millisecond
	rows := []struct {
		field    string
		policies []string // the first sets the field; the others contrast
		check    func(t *testing.T, r []*fieldRig)
	}{
		{
			field:    "max_attempts",
			policies: []string{fieldPolicy("max_attempts: 2"), fieldPolicy("max_attempts: 4")},
			check: func(t *testing.T, r []*fieldRig) {
				for i, want := range []int{2, 4} {
					a := r[i].do("GET", "/always-503", "503", nil, "")
					expect(t, fmt.Sprintf("max_attempts %d, GET meeting 503 every time", want), a, 503, want, "", want)
					if a.lastReason() != "max_attempts" {
						t.Errorf("max_attempts %d: last decision %v, want deny/max_attempts", want, a.reasons())
					}
				}
			},
		},
		{
			field:    "transient_statuses",
			policies: []string{fieldPolicy("transient_statuses: [500]"), fieldPolicy("transient_statuses: []")},
			check: func(t *testing.T, r []*fieldRig) {
				a := r[0].do("GET", "/x", "500; times=1", nil, "")
				expect(t, "[500], GET meeting one 500", a, 200, 2, "", 2)
				a = r[1].do("GET", "/x", "500; times=1", nil, "")
				expect(t, "[], GET meeting one 500", a, 500, 1, "", 1)
				if a.lastReason() != "status" {
					t.Errorf("[]: decisions %v, want deny/status", a.reasons())
				}
				// Transient is retried for idempotent requests only.
				a = r[0].do("POST", "/x", "500; times=1", nil, "b")
				expect(t, "[500], POST meeting one 500", a, 500, 1, "", 1)
			},
		},
		{
			field:    "method_default",
			policies: []string{fieldPolicy("method_default: off"), fieldPolicy("method_default: on")},
			check: func(t *testing.T, r []*fieldRig) {
				// off: a GET is not idempotent; its 503 is relayed as
				// ambiguous (spec section 6), the upstream ran it once.
				a := r[0].do("GET", "/x", "503; times=1", nil, "")
				expect(t, "off, GET meeting one 503", a, 503, 1, "ambiguous", 1)
				if a.tr.Idempotent || len(a.rec.Executions) != 1 {
					t.Errorf("off: trace idempotent %v, %d executions", a.tr.Idempotent, len(a.rec.Executions))
				}
				a = r[1].do("GET", "/x", "503; times=1", nil, "")
				expect(t, "on, GET meeting one 503", a, 200, 2, "", 2)
				if !a.tr.Idempotent {
					t.Error("on: a GET is not idempotent in the trace")
				}
			},
		},
		{
			field: "routes",
			policies: []string{
				fieldPolicy("routes:\n  - {method: POST, path_prefix: /v1/safe, idempotent: true}\n  - {method: GET, path_prefix: /v1/unsafe, idempotent: false}"),
				fieldPolicy("routes: []"),
			},
			check: func(t *testing.T, r []*fieldRig) {
				a := r[0].do("POST", "/v1/safe/search", "503; times=1", nil, "q")
				expect(t, "routes, POST /v1/safe/search meeting one 503", a, 200, 2, "", 2)
				a = r[1].do("POST", "/v1/safe/search", "503; times=1", nil, "q")
				expect(t, "no routes, POST /v1/safe/search meeting one 503", a, 503, 1, "ambiguous", 1)
				a = r[0].do("GET", "/v1/unsafe", "503; times=1", nil, "")
				expect(t, "routes, GET /v1/unsafe meeting one 503", a, 503, 1, "ambiguous", 1)
				a = r[1].do("GET", "/v1/unsafe", "503; times=1", nil, "")
				expect(t, "no routes, GET /v1/unsafe meeting one 503", a, 200, 2, "", 2)
				// Whole segments: /v1/unsafe does not cover /v1/unsafe-old.
				a = r[0].do("GET", "/v1/unsafe-old", "503; times=1", nil, "")
				expect(t, "routes, GET /v1/unsafe-old meeting one 503", a, 200, 2, "", 2)
			},
		},
		{
			field:    "honours_idempotency_key",
			policies: []string{fieldPolicy("honours_idempotency_key: true"), fieldPolicy("honours_idempotency_key: false")},
			check: func(t *testing.T, r []*fieldRig) {
				key := http.Header{"Idempotency-Key": {"k-1"}}
				// true: the keyed POST is retried; the ledger answers the
				// retry from its key store, so it ran once.
				a := r[0].do("POST", "/pay", "503; times=1", key, "amount=1")
				expect(t, "true, keyed POST meeting one 503", a, 200, 2, "", 2)
				if len(a.rec.Executions) != 1 || a.rec.Replays != 1 || !a.tr.Idempotent {
					t.Errorf("true: %v, trace idempotent %v; want 1 execution and 1 replay", a, a.tr.Idempotent)
				}
				// Without a key the POST stays unsafe.
				a = r[0].do("POST", "/pay", "503; times=1", nil, "amount=1")
				expect(t, "true, POST without a key meeting one 503", a, 503, 1, "ambiguous", 1)
				a = r[1].do("POST", "/pay", "503; times=1", key, "amount=1")
				expect(t, "false, keyed POST meeting one 503", a, 503, 1, "ambiguous", 1)
				if len(a.rec.Executions) != 1 || a.tr.Idempotent {
					t.Errorf("false: %v, trace idempotent %v", a, a.tr.Idempotent)
				}
			},
		},
		{
			field:    "attempt_timeout",
			policies: []string{fieldPolicy("max_attempts: 2", "attempt_timeout: 250ms"), fieldPolicy("max_attempts: 2", "attempt_timeout: 3s")},
			check: func(t *testing.T, r []*fieldRig) {
				a := r[0].do("GET", "/slow", "hold; ms=1500", nil, "")
				expect(t, "250ms, GET held 1500ms", a, 504, 2, "failed", 2)
				for _, at := range a.tr.Attempts {
					if at.Failure != engine.ResponseTimeout || at.Evidence != engine.SentNoResponse {
						t.Errorf("250ms: attempt %d failure %v evidence %v, want response_timeout / sent_no_response", at.N, at.Failure, at.Evidence)
					}
				}
				if a.lastReason() != "max_attempts" {
					t.Errorf("250ms: decisions %v", a.reasons())
				}
				// Not idempotent: the same timeout is ambiguous, not retried.
				a = r[0].do("POST", "/slow", "hold; ms=1500", nil, "b")
				expect(t, "250ms, POST held 1500ms", a, 504, 1, "ambiguous", 1)
				a = r[1].do("GET", "/slow", "hold; ms=1500", nil, "")
				expect(t, "3s, GET held 1500ms", a, 200, 1, "", 1)
			},
		},
		{
			field: "timeout",
			policies: []string{
				fieldPolicy("timeout: 500ms", "max_attempts: 100", "backoff: {kind: decorrelated, base: 20ms, max: 20ms}"),
				fieldPolicy("timeout: 5s", "max_attempts: 100", "backoff: {kind: decorrelated, base: 20ms, max: 20ms}"),
			},
			// 500ms, not less: on a loaded machine a first attempt must
			// get its head out well within the timeout.
			check: func(t *testing.T, r []*fieldRig) {
				a := r[0].do("GET", "/slow", "hold; ms=2000", nil, "")
				expect(t, "500ms, GET held 2000ms", a, 504, 1, "failed", 1)
				if a.elapsed >= 1500*ms {
					t.Errorf("500ms: answered after %v, the hold was 2000ms", a.elapsed)
				}
				a = r[1].do("GET", "/slow", "hold; ms=2000", nil, "")
				expect(t, "5s, GET held 2000ms", a, 200, 1, "", 1)
				// The overall timeout, waits included, bounds the attempts
				// well below max_attempts.
				a = r[0].do("GET", "/down", "503", nil, "")
				// The deadline may cut the last attempt before its head
				// went out (on a loaded machine): the ledger then saw one
				// arrival less, and that attempt must say not_sent.
				sent := a.attempts
				if n := len(a.tr.Attempts); n > 0 && a.tr.Attempts[n-1].Evidence == engine.NotSent {
					sent--
				}
				if a.status != 503 || a.attempts < 2 || a.attempts >= 50 || a.rec.Arrivals != sent || a.lastReason() != "deadline" {
					t.Errorf("500ms, GET meeting 503 every time: %v; want 503 after 2..49 attempts, the last denied for deadline", a)
				}
				if a.elapsed >= 2*time.Second {
					t.Errorf("500ms: answered after %v", a.elapsed)
				}
			},
		},
		{
			field: "min_attempt",
			policies: []string{
				// attempt_timeout 250ms: each attempt's head reaches the
				// ledger well within it even on a loaded machine (with 50ms
				// an attempt there was at times cut before its head went
				// out, not_sent, one arrival short).
				fieldPolicy("timeout: 5s", "attempt_timeout: 250ms", "min_attempt: 4900ms"),
				fieldPolicy("timeout: 5s", "attempt_timeout: 250ms", "min_attempt: 10ms"),
			},
			check: func(t *testing.T, r []*fieldRig) {
				// The first attempt takes its 250ms: less than 4.9s of the
				// 5s remain, so no retry is worth starting.
				a := r[0].do("GET", "/slow", "hold; ms=1500", nil, "")
				expect(t, "4900ms, GET held 1500ms", a, 504, 1, "failed", 1)
				if a.lastReason() != "deadline" {
					t.Errorf("4900ms: decisions %v, want deny/deadline", a.reasons())
				}
				a = r[1].do("GET", "/slow", "hold; ms=1500", nil, "")
				expect(t, "10ms, GET held 1500ms", a, 504, 3, "failed", 3)
				if a.lastReason() != "max_attempts" {
					t.Errorf("10ms: decisions %v, want retry, retry, deny/max_attempts", a.reasons())
				}
			},
		},
		{
			field: "backoff",
			policies: []string{
				fieldPolicy("max_attempts: 5", "backoff: {kind: decorrelated, base: 1ms, max: 3ms}"),
				fieldPolicy("max_attempts: 5", "backoff: {kind: decorrelated, base: 4ms, max: 6ms}"),
				fieldPolicy("max_attempts: 5", "backoff: {kind: full, base: 1ms, max: 2ms}"),
			},
			check: func(t *testing.T, r []*fieldRig) {
				// Decorrelated jitter waits between base and max; full
				// jitter up to min(max, base * 2^(n-1)) (spec section 4).
				bounds := []func(n int) (lo, hi time.Duration){
					func(int) (time.Duration, time.Duration) { return 1 * ms, 3 * ms },
					func(int) (time.Duration, time.Duration) { return 4 * ms, 6 * ms },
					func(n int) (time.Duration, time.Duration) { return 0, min(2*ms, ms<<(n-1)) },
				}
				for i, rig := range r {
					for range 3 {
						a := rig.do("GET", "/down", "503", nil, "")
						expect(t, fmt.Sprintf("policy %d, GET meeting 503 every time", i), a, 503, 5, "", 5)
						for _, at := range a.tr.Attempts[:len(a.tr.Attempts)-1] {
							lo, hi := bounds[i](at.N)
							if at.Decision.Decision != engine.Retry || at.Decision.Wait < lo || at.Decision.Wait > hi {
								t.Errorf("policy %d: attempt %d: %v wait %v, want retry waiting %v..%v", i, at.N, at.Decision.Decision, at.Decision.Wait, lo, hi)
							}
						}
					}
				}
			},
		},
		{
			field: "budget",
			policies: []string{
				fieldPolicy("budget: {ratio: 0, min_per_second: 1, ttl: 2s}"), // a floor of 2 retries
				fieldPolicy("budget: {ratio: 0, min_per_second: 1, ttl: 4s}"), // 4
				fieldPolicy("budget: {ratio: 1, min_per_second: 1, ttl: 2s}"), // 2, and 1 a request
			},
			check: func(t *testing.T, r []*fieldRig) {
				const requests = 4
				retries := make([]int, len(r))
				for i, rig := range r {
					var got []int
					for range requests {
						a := rig.do("GET", "/down", "503", nil, "")
						if a.status != 503 || a.rec.Arrivals != a.attempts {
							t.Errorf("policy %d: %v", i, a)
						}
						if a.attempts < 3 && a.lastReason() != "budget_exhausted" {
							t.Errorf("policy %d: %d attempts, decisions %v: want deny/budget_exhausted", i, a.attempts, a.reasons())
						}
						got = append(got, a.attempts)
						retries[i] += a.attempts - 1
					}
					t.Logf("policy %d: attempts %v", i, got)
				}
				if retries[0] != 2 || retries[1] != 4 {
					t.Errorf("retries with a floor of 2 (1/s for 2s): %d, of 4 (1/s for 4s): %d", retries[0], retries[1])
				}
				if retries[2] <= retries[0] || retries[2] > requests*1+2 {
					t.Errorf("retries with ratio 1: %d, want more than with ratio 0 (%d) and at most %d", retries[2], retries[0], requests+2)
				}
			},
		},
		{
			field:    "protocol",
			policies: []string{fieldPolicy("protocol: h2c"), fieldPolicy("protocol: http1"), fieldPolicy("protocol: auto")},
			check: func(t *testing.T, r []*fieldRig) {
				for i, want := range []string{"HTTP/2.0", "HTTP/1.1", "HTTP/1.1"} {
					a := r[i].do("GET", "/x", "", nil, "")
					expect(t, fmt.Sprintf("policy %d, GET", i), a, 200, 1, "", 1)
					if len(a.rec.Executions) != 1 || a.rec.Executions[0].Proto != want {
						t.Errorf("policy %d: ledger executions %+v, want one over %s", i, a.rec.Executions, want)
					}
				}
				// Retries keep the protocol.
				a := r[0].do("PUT", "/x", "503; times=1", nil, "v")
				expect(t, "h2c, PUT meeting one 503", a, 200, 2, "", 2)
				for _, e := range a.rec.Executions {
					if e.Proto != "HTTP/2.0" || e.BodySize != 1 {
						t.Errorf("h2c retry: execution %+v", e)
					}
				}
			},
		},
	}
	for _, row := range rows {
		t.Run(row.field, func(t *testing.T) {
			rigs := make([]*fieldRig, len(row.policies))
			for i, doc := range row.policies {
				rigs[i] = newFieldRig(t, doc)
			}
			row.check(t, rigs)
			if t.Failed() {
				for i, rig := range rigs {
					t.Logf("policy %d:\n%s", i, rig.doc)
				}
			}
		})
	}
}
