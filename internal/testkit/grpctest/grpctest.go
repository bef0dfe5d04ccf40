// Package grpctest is a real gRPC server for tests: grpc-go serving the
// interop TestService (google.golang.org/grpc/interop/grpc_testing, so no
// protoc is needed) with prior-knowledge HTTP/2 over cleartext (h2c) on a
// loopback listener. The test chooses, call by call, what the server does
// (a Plan: answer, UNAVAILABLE, RESOURCE_EXHAUSTED with a pushback, slow),
// and the server counts how many times each handler ran, so that a test
// through a proxy can assert how often the upstream executed a call (0
// duplicates) and what reached it (metadata, deadline, bytes).
package grpctest

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// The full method names of the TestService calls the server implements.
const (
	Service         = "/grpc.testing.TestService/"
	EmptyCall       = Service + "EmptyCall"
	UnaryCall       = Service + "UnaryCall"
	StreamingOutput = Service + "StreamingOutputCall" // server streaming
	StreamingInput  = Service + "StreamingInputCall"  // client streaming
)

// PushbackTrailer is the trailer by which a gRPC server tells a client how
// long to wait before retrying (gRPC proposal A6), in milliseconds; a
// negative value means do not retry.
const PushbackTrailer = "grpc-retry-pushback-ms"

// Fault is what the server does with a call.
type Fault int

const (
	// Answer runs the call and answers it.
	Answer Fault = iota
	// Unavailable answers UNAVAILABLE as Trailers-Only (no message, no
	// headers before the status), after the handler was entered.
	Unavailable
	// ResourceExhausted answers RESOURCE_EXHAUSTED as Trailers-Only with
	// the trailer grpc-retry-pushback-ms: Plan.Pushback.
	ResourceExhausted
	// Slow waits Plan.Delay, or until the call ends (its deadline, a
	// cancel), before answering; a call that ended first gets the status
	// of its context's error (DEADLINE_EXCEEDED, CANCELLED).
	Slow
)

func (f Fault) String() string {
	switch f {
	case Answer:
		return "answer"
	case Unavailable:
		return "unavailable"
	case ResourceExhausted:
		return "resource_exhausted"
	case Slow:
		return "slow"
	}
	return "fault?"
}

// Plan is what the server does with one call.
type Plan struct {
	Fault Fault
	// Pushback is the value of grpc-retry-pushback-ms for
	// ResourceExhausted ("100", "-1"); empty sends none.
	Pushback string
	// Delay is how long Slow waits.
	Delay time.Duration
}

// Call names one call as the planner sees it.
type Call struct {
	// Method is the full method name (UnaryCall, …).
	Method string
	// N counts the calls of Method, from 1: the second call of UnaryCall
	// (a retry, say) has N 2.
	N int
}

// Planner chooses a Plan for each call. It is called from the server's
// handlers, concurrently.
type Planner func(Call) Plan

// Sequence is a Planner giving the n-th call of any method plans[n-1],
// and Answer to the calls after the last.
func Sequence(plans ...Plan) Planner {
	return func(c Call) Plan {
		if c.N <= len(plans) {
			return plans[c.N-1]
		}
		return Plan{}
	}
}

// Seen is what reached the server in one call, recorded when its handler
// returned.
type Seen struct {
	Call
	Plan Plan
	// Metadata is the call's request metadata (headers).
	Metadata metadata.MD
	// Deadline is the call's deadline as the server saw it (from
	// grpc-timeout); zero when it had none.
	Deadline time.Time
	// Received is the payload bytes the call's request messages carried,
	// and Messages their number.
	Received, Messages int
	// Status is what the handler answered.
	Status codes.Code
}

// Server is a running gRPC TestService server.
type Server struct {
	testpb.UnimplementedTestServiceServer
	// Addr is where it listens (loopback).
	Addr netip.AddrPort
	// GRPC is the grpc-go server itself (GracefulStop, Stop).
	GRPC *grpc.Server

	plan Planner

	mu         sync.Mutex
	calls      map[string]int
	executions map[string]int
	seen       []Seen
	changed    chan struct{} // closed and replaced whenever a call ends
}

// Start serves the TestService on a loopback port until the test ends,
// planning each call with plan (nil: answer every call).
func Start(t testing.TB, plan Planner) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if plan == nil {
		plan = func(Call) Plan { return Plan{} }
	}
	s := &Server{
		Addr:       ln.Addr().(*net.TCPAddr).AddrPort(),
		GRPC:       grpc.NewServer(),
		plan:       plan,
		calls:      map[string]int{},
		executions: map[string]int{},
		changed:    make(chan struct{}),
	}
	testpb.RegisterTestServiceServer(s.GRPC, s)
	go s.GRPC.Serve(ln)
	t.Cleanup(s.GRPC.Stop)
	return s
}

// Executions returns how many times method's handler ran (entered), a
// fault answered or not.
func (s *Server) Executions(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executions[method]
}

// Seen returns the calls whose handlers returned, in the order they did.
func (s *Server) Seen() []Seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Seen(nil), s.seen...)
}

// WaitSeen waits until n calls have returned or ctx ends, and returns
// those seen (fewer than n if ctx ended first). It is what a test waits
// on after a call whose answer it did not get from the server (a client
// deadline, a cancel).
func (s *Server) WaitSeen(ctx context.Context, n int) []Seen {
	for {
		s.mu.Lock()
		if len(s.seen) >= n {
			out := append([]Seen(nil), s.seen...)
			s.mu.Unlock()
			return out
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return s.Seen()
		}
	}
}

// begin counts an execution of method and returns its call and plan.
func (s *Server) begin(ctx context.Context, method string) (Seen, Plan) {
	s.mu.Lock()
	s.calls[method]++
	s.executions[method]++
	c := Call{Method: method, N: s.calls[method]}
	s.mu.Unlock()
	p := s.plan(c)
	md, _ := metadata.FromIncomingContext(ctx)
	dl, _ := ctx.Deadline()
	return Seen{Call: c, Plan: p, Metadata: md.Copy(), Deadline: dl}, p
}

// end records a call's answer.
func (s *Server) end(seen Seen, err error) {
	seen.Status = status.Code(err)
	s.mu.Lock()
	s.seen = append(s.seen, seen)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// fault does what p says before a call answers; a non-nil error is the
// call's answer.
func fault(ctx context.Context, p Plan) error {
	switch p.Fault {
	case Unavailable:
		return status.Error(codes.Unavailable, "grpctest: planned UNAVAILABLE")
	case ResourceExhausted:
		if p.Pushback != "" {
			grpc.SetTrailer(ctx, metadata.Pairs(PushbackTrailer, p.Pushback))
		}
		return status.Error(codes.ResourceExhausted, "grpctest: planned RESOURCE_EXHAUSTED")
	case Slow:
		t := time.NewTimer(p.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return nil
}

// EmptyCall answers an empty message.
func (s *Server) EmptyCall(ctx context.Context, _ *testpb.Empty) (_ *testpb.Empty, err error) {
	seen, p := s.begin(ctx, EmptyCall)
	defer func() { s.end(seen, err) }()
	if err := fault(ctx, p); err != nil {
		return nil, err
	}
	return &testpb.Empty{}, nil
}

// UnaryCall answers a payload of the requested size, or, when none is
// requested, the request's payload back.
func (s *Server) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (_ *testpb.SimpleResponse, err error) {
	seen, p := s.begin(ctx, UnaryCall)
	seen.Received, seen.Messages = len(req.GetPayload().GetBody()), 1
	defer func() { s.end(seen, err) }()
	if err := fault(ctx, p); err != nil {
		return nil, err
	}
	body := req.GetPayload().GetBody()
	if req.GetResponseSize() > 0 {
		body = make([]byte, req.GetResponseSize())
	}
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: body}}, nil
}

// StreamingOutputCall streams one message per response parameter, of its
// size, waiting its interval before each.
func (s *Server) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) (err error) {
	ctx := stream.Context()
	seen, p := s.begin(ctx, StreamingOutput)
	seen.Received, seen.Messages = len(req.GetPayload().GetBody()), 1
	defer func() { s.end(seen, err) }()
	if err := fault(ctx, p); err != nil {
		return err
	}
	for i, rp := range req.GetResponseParameters() {
		if d := time.Duration(rp.GetIntervalUs()) * time.Microsecond; d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return status.FromContextError(ctx.Err()).Err()
			}
		}
		body := make([]byte, rp.GetSize())
		if len(body) > 0 {
			body[0] = byte(i) // which message this is, for order checks
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: body}}); err != nil {
			return err
		}
	}
	return nil
}

// StreamingInputCall reads every request message and answers their
// payloads' total size. The plan's fault comes after the last message
// was read.
func (s *Server) StreamingInputCall(stream grpc.ClientStreamingServer[testpb.StreamingInputCallRequest, testpb.StreamingInputCallResponse]) (err error) {
	ctx := stream.Context()
	seen, p := s.begin(ctx, StreamingInput)
	defer func() { s.end(seen, err) }()
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		seen.Received += len(m.GetPayload().GetBody())
		seen.Messages++
	}
	if err := fault(ctx, p); err != nil {
		return err
	}
	return stream.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: int32(seen.Received)})
}

// Client returns a TestService client on Dial(t, target, opts...).
func Client(t testing.TB, target string, opts ...grpc.DialOption) testpb.TestServiceClient {
	t.Helper()
	return testpb.NewTestServiceClient(Dial(t, target, opts...))
}

// Dial returns a real grpc-go channel to target (host:port) with insecure
// credentials (h2c) and grpc-go's own retries off, so that every retry a
// test sees is the proxy's. The channel is closed when the test ends.
func Dial(t testing.TB, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableRetry(),
	}, opts...)
	cc, err := grpc.NewClient("passthrough:///"+target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
