package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/testkit/grpctest"
	"github.com/egret-proxy/egret/internal/testkit/h2fault"
	"github.com/egret-proxy/egret/internal/testkit/testenv"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// Issue 23: a pod's gRPC calls (h2c, prior knowledge) through egret in
// transparent mode, with a real grpc-go client and a real upstream
// (grpctest: grpc-go; h2fault: a raw HTTP/2 server for the stream faults
// grpc-go cannot make). Each stream is one request through the same
// policy, engine and budget as HTTP/1.1.

// grpcPolicy is the defaults of the gRPC tests: short waits and a
// generous budget, so that only what a test sets decides. extra is
// appended as is (an upstreams block).
func grpcPolicy(t *testing.T, extra string) PolicySource {
	return mustPolicy(t, `defaults:
  max_attempts: 3
  timeout: 5s
  min_attempt: 10ms
  backoff: {kind: full, base: 1ms, max: 5ms}
  budget: {ratio: 1, min_per_second: 1000, ttl: 10s}
`+extra)
}

// idempotentRoute is a policy declaring the gRPC method (or service
// prefix) at path idempotent for the upstream on loopback (its address's
// entry: the client's :authority is egret's loopback address).
func idempotentRoute(path string) string {
	return "upstreams:\n  - host: 127.0.0.1\n    routes:\n      - {method: POST, path_prefix: " + path + ", idempotent: true}\n"
}

// grpcVia starts egret in transparent mode, every connection's original
// destination dst, and returns a real gRPC client whose channel connects
// to it (as a pod's would, redirected), and the proxy.
func grpcVia(t *testing.T, dst netip.AddrPort, cfg Config) (testpb.TestServiceClient, *testProxy) {
	t.Helper()
	cfg.Mode = Transparent
	if cfg.Resolver == nil {
		cfg.Resolver = &StaticResolver{Dst: dst}
	}
	p := startProxy(t, cfg)
	return grpctest.Client(t, p.addr), p
}

// callCtx bounds a test's calls: a proxy that never answers fails the
// test, not the run.
func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// grpcAnswer is what a gRPC client got from one call: its status, and the
// header and trailer metadata.
type grpcAnswer struct {
	err     error
	header  metadata.MD
	trailer metadata.MD
}

func (a grpcAnswer) code() codes.Code { return status.Code(a.err) }

// get returns the first value of key from the response headers, else
// from the trailers (a Trailers-Only answer has only trailers, and grpc-go
// gives its fields as trailers).
func (a grpcAnswer) get(key string) string {
	if v := a.header.Get(key); len(v) > 0 {
		return v[0]
	}
	if v := a.trailer.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (a grpcAnswer) String() string {
	return fmt.Sprintf("status %v, headers %v, trailers %v", status.Convert(a.err), a.header, a.trailer)
}

// unary makes one UnaryCall with payload body.
func unary(ctx context.Context, c testpb.TestServiceClient, body string) (*testpb.SimpleResponse, grpcAnswer) {
	var a grpcAnswer
	resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte(body)}},
		grpc.Header(&a.header), grpc.Trailer(&a.trailer))
	a.err = err
	return resp, a
}

// checkGRPCEgret asserts what every answer through egret carries, as
// gRPC metadata: egret-attempts, and a 16-digit egret-request-id.
func checkGRPCEgret(t *testing.T, a grpcAnswer, attempts string) {
	t.Helper()
	if id := a.get("egret-request-id"); len(id) != 16 {
		t.Errorf("egret-request-id = %q, want a 16-digit id (%v)", id, a)
	}
	if got := a.get("egret-attempts"); got != attempts {
		t.Errorf("egret-attempts = %q, want %q (%v)", got, attempts, a)
	}
}

// h2faultMessage is the SimpleResponse h2fault answers with.
func h2faultMessage(t *testing.T) []byte {
	b, err := proto.Marshal(&testpb.SimpleResponse{Username: "h2fault"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGRPCUnary(t *testing.T) {
	up := grpctest.Start(t, nil)
	c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, "")})
	ctx := metadata.AppendToOutgoingContext(callCtx(t), "x-tenant", "blue")
	resp, a := unary(ctx, c, "hello")
	if a.err != nil || string(resp.GetPayload().GetBody()) != "hello" {
		t.Fatalf("%v; response %v", a, resp)
	}
	checkGRPCEgret(t, a, "1")
	seen := up.Seen()
	if n := up.Executions(grpctest.UnaryCall); n != 1 || len(seen) != 1 {
		t.Fatalf("upstream ran it %d times", n)
	}
	if v := seen[0].Metadata.Get("x-tenant"); len(v) != 1 || v[0] != "blue" {
		t.Errorf("upstream metadata %v, want x-tenant: blue", seen[0].Metadata)
	}
}

// An upstream's REFUSED_STREAM, and a GOAWAY whose last-stream-id is
// below the stream, say the stream was never processed (RFC 9113 §8.7):
// NOT_SENT, retried even though a gRPC call is a POST.
func TestGRPCNotProcessedRetried(t *testing.T) {
	for _, act := range []h2fault.Action{h2fault.Refuse, h2fault.GoAwayBelow} {
		t.Run(act.String(), func(t *testing.T) {
			up := h2fault.Start(t, h2fault.Config{Plan: h2fault.Sequence(act), Message: h2faultMessage(t), GoAwayGrace: 200 * time.Millisecond})
			c, p := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, ""), Traces: NewTraces(16)})
			resp, a := unary(callCtx(t), c, "x")
			if a.err != nil || resp.GetUsername() != "h2fault" {
				t.Fatalf("%v; response %v", a, resp)
			}
			checkGRPCEgret(t, a, "2")
			// egret's trace of the stream (what `egret explain` shows):
			// the first attempt not sent, the second answered.
			if tr, ok := p.Traces().Get(a.get("egret-request-id")); !ok || len(tr.Attempts) != 2 {
				t.Errorf("trace of %s: %+v (kept %v), want 2 attempts", a.get("egret-request-id"), tr, ok)
			} else if ev := tr.Attempts[0].Evidence; ev != engine.NotSent {
				t.Errorf("attempt 1's evidence %v, want not_sent", ev)
			}
			reqs := up.Requests()
			if up.Executions() != 1 || len(reqs) != 2 {
				t.Fatalf("upstream: %d executions, %d requests; want 1 execution of 2 requests", up.Executions(), len(reqs))
			}
			// The retry carries the whole call: one length-prefixed message.
			want := 5 + proto.Size(&testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("x")}})
			if reqs[1].Path != grpctest.UnaryCall || reqs[1].Body != want {
				t.Errorf("the retry %s carried %d bytes, want %d", reqs[1].Describe(), reqs[1].Body, want)
			}
		})
	}
}

// Every attempt refused: a not-sent outcome that egret answers itself, as
// Trailers-Only UNAVAILABLE (the client may retry it: nothing ran) with
// egret-outcome.
func TestGRPCEveryAttemptRefused(t *testing.T) {
	up := h2fault.Start(t, h2fault.Config{Plan: func(int64, string) h2fault.Action { return h2fault.Refuse }})
	c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, "")})
	_, a := unary(callCtx(t), c, "x")
	if a.code() != codes.Unavailable {
		t.Fatalf("%v, want UNAVAILABLE", a)
	}
	if got := a.get("egret-outcome"); got != engine.OutcomeNotSent.String() {
		t.Errorf("egret-outcome = %q, want %q (%v)", got, engine.OutcomeNotSent, a)
	}
	if len(a.header) != 0 {
		t.Errorf("headers %v before the status: want Trailers-Only", a.header)
	}
	checkGRPCEgret(t, a, "3")
	if up.Executions() != 0 || len(up.Requests()) != 3 {
		t.Fatalf("upstream: %d executions, %d requests; want 0 of 3", up.Executions(), len(up.Requests()))
	}
}

// A stream reset after the upstream read the whole request may have run:
// SENT_NO_RESPONSE, not retried for a POST, and egret says so in gRPC's
// terms: Trailers-Only, grpc-status UNKNOWN (never UNAVAILABLE, which
// standard client retry configs retry), egret-outcome: ambiguous, and a
// grpc-message saying the outcome is ambiguous.
func TestGRPCResetAfterReadAmbiguous(t *testing.T) {
	up := h2fault.Start(t, h2fault.Config{Plan: h2fault.Sequence(h2fault.ResetAfterRead)})
	c, p := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, ""), Traces: NewTraces(16)})
	_, a := unary(callCtx(t), c, "charge")
	if tr, ok := p.Traces().Get(a.get("egret-request-id")); !ok || len(tr.Attempts) != 1 {
		t.Errorf("trace of %s: %+v (kept %v), want 1 attempt", a.get("egret-request-id"), tr, ok)
	} else if ev := tr.Attempts[0].Evidence; ev != engine.SentNoResponse {
		t.Errorf("attempt 1's evidence %v, want sent_no_response", ev)
	}
	if a.code() != codes.Unknown {
		t.Errorf("%v, want UNKNOWN", a)
	}
	if got := a.get("egret-outcome"); got != engine.OutcomeAmbiguous.String() {
		t.Errorf("egret-outcome = %q, want ambiguous (%v)", got, a)
	}
	if msg := status.Convert(a.err).Message(); !strings.Contains(strings.ToLower(msg), "ambiguous") {
		t.Errorf("grpc-message %q does not say the outcome is ambiguous", msg)
	}
	if len(a.header) != 0 {
		t.Errorf("headers %v before the status: want Trailers-Only", a.header)
	}
	checkGRPCEgret(t, a, "1")
	if up.Executions() != 1 || len(up.Requests()) != 1 {
		t.Fatalf("upstream: %d executions, %d requests; want 1 of 1", up.Executions(), len(up.Requests()))
	}
}

// Response headers then a reset (PARTIAL_RESPONSE) of a call not declared
// idempotent: the upstream ran it; never retried, and the client does not
// get OK.
func TestGRPCHeadersThenResetNotRetried(t *testing.T) {
	up := h2fault.Start(t, h2fault.Config{Plan: h2fault.Sequence(h2fault.HeadersThenReset), Message: h2faultMessage(t)})
	c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, "")})
	_, a := unary(callCtx(t), c, "x")
	if a.err == nil {
		t.Fatalf("OK after the upstream reset the answer: %v", a)
	}
	if up.Executions() != 1 || len(up.Requests()) != 1 {
		t.Fatalf("upstream: %d executions, %d requests; want 1 of 1", up.Executions(), len(up.Requests()))
	}
}

// UNAVAILABLE as Trailers-Only: a gRPC call is a POST, so by default it is
// not retried; when the policy declares the method idempotent (by its
// path, or its service's prefix), it is retried like a 503.
func TestGRPCUnavailable(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		up := grpctest.Start(t, grpctest.Sequence(grpctest.Plan{Fault: grpctest.Unavailable}))
		c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, "")})
		_, a := unary(callCtx(t), c, "x")
		if a.code() != codes.Unavailable {
			t.Fatalf("%v, want the upstream's UNAVAILABLE", a)
		}
		checkGRPCEgret(t, a, "1")
		if n := up.Executions(grpctest.UnaryCall); n != 1 {
			t.Fatalf("upstream ran it %d times, want 1", n)
		}
	})
	for _, route := range []string{grpctest.UnaryCall, grpctest.Service} {
		t.Run("idempotent "+route, func(t *testing.T) {
			up := grpctest.Start(t, grpctest.Sequence(grpctest.Plan{Fault: grpctest.Unavailable}))
			c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, idempotentRoute(route))})
			resp, a := unary(callCtx(t), c, "again")
			if a.err != nil || string(resp.GetPayload().GetBody()) != "again" {
				t.Fatalf("%v; response %v", a, resp)
			}
			checkGRPCEgret(t, a, "2")
			if n := up.Executions(grpctest.UnaryCall); n != 2 {
				t.Fatalf("upstream ran it %d times, want 2", n)
			}
		})
	}
	// A route for another method does not make this one idempotent.
	t.Run("other method idempotent", func(t *testing.T) {
		up := grpctest.Start(t, grpctest.Sequence(grpctest.Plan{Fault: grpctest.Unavailable}))
		c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, idempotentRoute(grpctest.EmptyCall))})
		_, a := unary(callCtx(t), c, "x")
		if a.code() != codes.Unavailable {
			t.Fatalf("%v, want UNAVAILABLE", a)
		}
		checkGRPCEgret(t, a, "1")
	})
}

// RESOURCE_EXHAUSTED with grpc-retry-pushback-ms on an idempotent method
// is a 429 with Retry-After: retried no sooner than the pushback; a
// negative pushback says do not retry.
func TestGRPCResourceExhaustedPushback(t *testing.T) {
	t.Run("pushback 300ms", func(t *testing.T) {
		up := grpctest.Start(t, grpctest.Sequence(grpctest.Plan{Fault: grpctest.ResourceExhausted, Pushback: "300"}))
		c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, idempotentRoute(grpctest.Service))})
		start := time.Now()
		resp, a := unary(callCtx(t), c, "later")
		took := time.Since(start)
		if a.err != nil || string(resp.GetPayload().GetBody()) != "later" {
			t.Fatalf("%v; response %v", a, resp)
		}
		checkGRPCEgret(t, a, "2")
		if n := up.Executions(grpctest.UnaryCall); n != 2 {
			t.Fatalf("upstream ran it %d times, want 2", n)
		}
		if took < 300*time.Millisecond {
			t.Errorf("answered after %v: the retry came before the 300 ms pushback", took)
		}
	})
	t.Run("pushback negative", func(t *testing.T) {
		up := grpctest.Start(t, grpctest.Sequence(grpctest.Plan{Fault: grpctest.ResourceExhausted, Pushback: "-1"}))
		c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, idempotentRoute(grpctest.Service))})
		_, a := unary(callCtx(t), c, "x")
		if a.code() != codes.ResourceExhausted {
			t.Fatalf("%v, want the upstream's RESOURCE_EXHAUSTED", a)
		}
		checkGRPCEgret(t, a, "1")
		if got := a.get(grpctest.PushbackTrailer); got != "-1" {
			t.Errorf("%s = %q: the upstream's trailer did not reach the client", grpctest.PushbackTrailer, got)
		}
		if n := up.Executions(grpctest.UnaryCall); n != 1 {
			t.Fatalf("upstream ran it %d times, want 1", n)
		}
	})
}

// grpc-timeout bounds the request's deadline: the upstream sees a
// deadline no later than the client's, and its handler ends with it, well
// before the policy's 5 s timeout; the slow call is not retried.
func TestGRPCTimeoutBoundsDeadline(t *testing.T) {
	up := grpctest.Start(t, func(grpctest.Call) grpctest.Plan { return grpctest.Plan{Fault: grpctest.Slow, Delay: time.Minute} })
	c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, idempotentRoute(grpctest.Service))})
	ctx, cancel := context.WithTimeout(callCtx(t), 400*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	_, a := unary(ctx, c, "x")
	if a.code() != codes.DeadlineExceeded {
		t.Errorf("%v, want DEADLINE_EXCEEDED", a)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer wcancel()
	seen := up.WaitSeen(wctx, 1)
	if len(seen) == 0 {
		t.Fatal("the upstream's handler did not end within 3 s of the client's deadline")
	}
	if seen[0].Deadline.IsZero() {
		t.Fatal("the upstream saw no deadline: grpc-timeout did not reach it")
	}
	if seen[0].Deadline.After(deadline.Add(50 * time.Millisecond)) {
		t.Errorf("the upstream's deadline is %v after the client's", seen[0].Deadline.Sub(deadline))
	}
	if n := up.Executions(grpctest.UnaryCall); n != 1 {
		t.Errorf("upstream ran it %d times, want 1", n)
	}
}

// A client's cancel (RST_STREAM CANCEL) ends the stream's attempt: the
// upstream's handler sees its call cancelled at once, long before the
// policy's timeout or its own delay, and the call is not sent again.
func TestGRPCClientCancelEndsAttempt(t *testing.T) {
	up := grpctest.Start(t, func(grpctest.Call) grpctest.Plan { return grpctest.Plan{Fault: grpctest.Slow, Delay: time.Minute} })
	c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, idempotentRoute(grpctest.Service))})
	ctx, cancel := context.WithCancel(callCtx(t))
	done := make(chan grpcAnswer, 1)
	go func() {
		_, a := unary(ctx, c, "x")
		done <- a
	}()
	// Cancel once the call reached the upstream's handler.
	testenv.Eventually(t, 5*time.Second, "the call reaching the upstream", func() bool { return up.Executions(grpctest.UnaryCall) == 1 })
	cancel()
	if a := <-done; a.code() != codes.Canceled {
		t.Errorf("%v, want CANCELLED", a)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer wcancel()
	seen := up.WaitSeen(wctx, 1)
	if len(seen) != 1 {
		t.Fatal("the upstream's handler was not cancelled within 3 s of the client's RST_STREAM")
	}
	if seen[0].Status != codes.Canceled {
		t.Errorf("the upstream's call ended %v, want CANCELLED", seen[0].Status)
	}
	if n := up.Executions(grpctest.UnaryCall); n != 1 {
		t.Errorf("upstream ran it %d times, want 1", n)
	}
}

func TestGRPCServerStreaming(t *testing.T) {
	up := grpctest.Start(t, nil)
	c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, "")})
	const n = 100
	var params []*testpb.ResponseParameters
	for range n {
		params = append(params, &testpb.ResponseParameters{Size: 4096})
	}
	st, err := c.StreamingOutputCall(callCtx(t), &testpb.StreamingOutputCallRequest{ResponseParameters: params})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after %d messages: %v", got, err)
		}
		if b := m.GetPayload().GetBody(); len(b) != 4096 || b[0] != byte(got) {
			t.Fatalf("message %d: %d bytes, index %d", got, len(b), b[0])
		}
		got++
	}
	if got != n {
		t.Fatalf("%d messages, want %d", got, n)
	}
	h, _ := st.Header()
	checkGRPCEgret(t, grpcAnswer{header: h, trailer: st.Trailer()}, "1")
}

// A client stream larger than the body memory and spool limits is sent
// one-shot (not replayable) and still arrives whole, once.
func TestGRPCClientStreamingOverMemoryLimit(t *testing.T) {
	up := grpctest.Start(t, nil)
	pol := grpcPolicy(t, "upstreams:\n  - host: 127.0.0.1\n    body: {memory_limit: 16KiB, spool_limit: 64KiB}\n")
	c, _ := grpcVia(t, up.Addr, Config{Policy: pol})
	st, err := c.StreamingInputCall(callCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 32<<10)
	const msgs = 16 // 512 KiB
	for i := range msgs {
		if err := st.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: chunk}}); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	resp, err := st.CloseAndRecv()
	if err != nil || resp.GetAggregatedPayloadSize() != msgs*32<<10 {
		t.Fatalf("%v, %v; want %d bytes counted", resp, err, msgs*32<<10)
	}
	h, _ := st.Header()
	checkGRPCEgret(t, grpcAnswer{header: h, trailer: st.Trailer()}, "1")
	if n := up.Executions(grpctest.StreamingInput); n != 1 {
		t.Fatalf("upstream ran it %d times", n)
	}
}

// Many concurrent streams on one client connection: each is a request of
// its own (its own id), all succeed, each runs once.
func TestGRPCManyConcurrentStreams(t *testing.T) {
	up := grpctest.Start(t, nil)
	c, _ := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, "")})
	const n = 100
	ctx := callCtx(t)
	var wg sync.WaitGroup
	answers := make([]grpcAnswer, n)
	bodies := make([]string, n)
	for i := range n {
		wg.Go(func() {
			resp, a := unary(ctx, c, fmt.Sprintf("call %d", i))
			answers[i], bodies[i] = a, string(resp.GetPayload().GetBody())
		})
	}
	wg.Wait()
	ids := map[string]bool{}
	failed, unmarked := 0, 0
	for i, a := range answers {
		if a.err != nil || bodies[i] != fmt.Sprintf("call %d", i) {
			failed++
			if failed <= 3 {
				t.Errorf("call %d: %v, body %q", i, a, bodies[i])
			}
			continue
		}
		if id := a.get("egret-request-id"); len(id) == 16 && a.get("egret-attempts") == "1" {
			ids[id] = true
		} else if unmarked++; unmarked <= 3 {
			t.Errorf("call %d answered without egret-attempts 1 and a request id: %v", i, a)
		}
	}
	if failed > 0 || unmarked > 0 {
		t.Fatalf("of %d calls, %d failed and %d came without egret's headers", n, failed, unmarked)
	}
	if len(ids) != n {
		t.Errorf("%d distinct egret-request-ids for %d calls", len(ids), n)
	}
	if e := up.Executions(grpctest.UnaryCall); e != n {
		t.Errorf("upstream ran %d calls, want %d", e, n)
	}
}

// After an h2c connection egret served, the destination is not learned as
// one to bypass (issue 23: it was learned as not HTTP, and HTTP/1.1 to the
// same port lost egret for the learning's TTL).
func TestGRPCDestinationNotLearned(t *testing.T) {
	up := grpctest.Start(t, nil)
	lr := &recordLearner{}
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: up.Addr}, Policy: grpcPolicy(t, ""), Learner: lr})
	cc := grpctest.Dial(t, p.addr)
	resp, a := unary(callCtx(t), testpb.NewTestServiceClient(cc), "x")
	if a.err != nil || string(resp.GetPayload().GetBody()) != "x" {
		t.Fatalf("%v", a)
	}
	checkGRPCEgret(t, a, "1")
	if got := lr.learned(); len(got) != 0 {
		t.Fatalf("learned %v during an h2c connection", got)
	}
	// And none when it ends.
	cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Errorf("shutdown after the client closed: %v", err)
	}
	if got := lr.learned(); len(got) != 0 {
		t.Fatalf("learned %v after an h2c connection", got)
	}
}

// A client stream beyond the body's memory limit is sent one-shot: each
// refusal is retried only while what was sent is still kept (how far an
// attempt read before its refusal came is timing), and once it is not,
// egret answers not-sent itself. Every attempt reached the upstream as one
// request, and nothing ran.
func TestGRPCOneShotBodyRefused(t *testing.T) {
	up := h2fault.Start(t, h2fault.Config{Plan: func(int64, string) h2fault.Action { return h2fault.Refuse }})
	pol := grpcPolicy(t, "upstreams:\n  - host: 127.0.0.1\n    body: {memory_limit: 16KiB, spool_limit: 64KiB}\n")
	c, _ := grpcVia(t, up.Addr, Config{Policy: pol})
	var a grpcAnswer
	st, err := c.StreamingInputCall(callCtx(t), grpc.Header(&a.header), grpc.Trailer(&a.trailer))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 32<<10)
	for range 8 { // 256 KiB
		if err := st.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: chunk}}); err != nil {
			break // the answer came first: CloseAndRecv tells it
		}
	}
	_, a.err = st.CloseAndRecv()
	if a.code() != codes.Unavailable || a.get("egret-outcome") != engine.OutcomeNotSent.String() {
		t.Errorf("%v, want UNAVAILABLE with egret-outcome not-sent", a)
	}
	n := len(up.Requests())
	checkGRPCEgret(t, a, strconv.Itoa(n))
	if up.Executions() != 0 || n < 1 || n > 3 {
		t.Fatalf("upstream: %d executions, %d requests; want 0 of 1 to 3", up.Executions(), n)
	}
	if !strings.Contains(status.Convert(a.err).Message(), "one-shot") && n < 3 {
		t.Errorf("stopped after %d attempts without saying the body is one-shot: %v", n, a)
	}
}

// egret's graceful shutdown with a gRPC call in flight: the call
// completes (GOAWAY lets the streams below it finish), once.
func TestGRPCShutdownLetsCallFinish(t *testing.T) {
	up := grpctest.Start(t, grpctest.Sequence(grpctest.Plan{Fault: grpctest.Slow, Delay: 500 * time.Millisecond}))
	c, p := grpcVia(t, up.Addr, Config{Policy: grpcPolicy(t, "")})
	done := make(chan grpcAnswer, 1)
	go func() {
		resp, a := unary(callCtx(t), c, "in flight")
		if a.err == nil && string(resp.GetPayload().GetBody()) != "in flight" {
			a.err = fmt.Errorf("body %q", resp.GetPayload().GetBody())
		}
		done <- a
	}()
	testenv.Eventually(t, 5*time.Second, "the call reaching the upstream", func() bool { return up.Executions(grpctest.UnaryCall) == 1 })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	a := <-done
	if a.err != nil {
		t.Fatalf("the call in flight at shutdown: %v", a)
	}
	checkGRPCEgret(t, a, "1")
	if n := up.Executions(grpctest.UnaryCall); n != 1 {
		t.Errorf("upstream ran it %d times, want 1", n)
	}
}

// grpc-timeout alone bounds the call: a client that sends it and never
// cancels (a raw HTTP/2 client, no deadline of its own) gets egret's
// answer at the grpc-timeout, well before the policy's 5 s, and the
// upstream's call ends with it.
func TestGRPCTimeoutHeaderAlone(t *testing.T) {
	up := grpctest.Start(t, func(grpctest.Call) grpctest.Plan { return grpctest.Plan{Fault: grpctest.Slow, Delay: time.Minute} })
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: up.Addr}, Policy: grpcPolicy(t, "")})
	msg, err := proto.Marshal(&testpb.SimpleRequest{})
	if err != nil {
		t.Fatal(err)
	}
	frame := append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...)
	req, _ := http.NewRequestWithContext(callCtx(t), http.MethodPost, "http://grpc.test"+grpctest.UnaryCall, bytes.NewReader(frame))
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	req.Header.Set("Grpc-Timeout", "300m")
	start := time.Now()
	resp, err := h2cClient(p.addr).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	code := resp.Header.Get("Grpc-Status")
	if code == "" {
		code = resp.Trailer.Get("Grpc-Status")
	}
	// The upstream read the call: its outcome is ambiguous, which egret
	// says as UNKNOWN (DEADLINE_EXCEEDED, gRPC's own word for a call whose
	// deadline passed, would say it as truly), never UNAVAILABLE or OK.
	if resp.StatusCode != http.StatusOK || (code != strconv.Itoa(int(codes.Unknown)) && code != strconv.Itoa(int(codes.DeadlineExceeded))) {
		t.Errorf("status %d, grpc-status %q (headers %v, trailers %v), want 200 with grpc-status 2 or 4", resp.StatusCode, code, resp.Header, resp.Trailer)
	}
	if o := resp.Header.Get(HeaderOutcome); o != engine.OutcomeAmbiguous.String() {
		t.Errorf("%s = %q, want ambiguous: the upstream had the call", HeaderOutcome, o)
	}
	if took > 3*time.Second {
		t.Errorf("answered after %v: grpc-timeout 300m did not bound the call", took)
	}
	wctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	seen := up.WaitSeen(wctx, 1)
	if len(seen) != 1 {
		t.Fatal("the upstream's call did not end within 3 s of the grpc-timeout")
	}
	if seen[0].Deadline.IsZero() || seen[0].Deadline.Sub(start) > 400*time.Millisecond {
		t.Errorf("the upstream's deadline is %v after the call's start, want at most the grpc-timeout", seen[0].Deadline.Sub(start))
	}
	if n := up.Executions(grpctest.UnaryCall); n != 1 {
		t.Errorf("upstream ran it %d times, want 1", n)
	}
}
