package grpctest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// Each plan's answer as a real grpc-go client sees it, and the handler
// runs counted once per call.
func TestPlans(t *testing.T) {
	s := Start(t, Sequence(
		Plan{Fault: Unavailable},
		Plan{Fault: ResourceExhausted, Pushback: "250"},
		Plan{Fault: Slow, Delay: time.Minute},
		Plan{},
	))
	c := Client(t, s.Addr.String())
	ctx := t.Context()
	req := &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("hello")}}

	if _, err := c.UnaryCall(ctx, req); status.Code(err) != codes.Unavailable {
		t.Fatalf("call 1: %v, want UNAVAILABLE", err)
	}
	var tr metadata.MD
	if _, err := c.UnaryCall(ctx, req, grpc.Trailer(&tr)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("call 2: %v, want RESOURCE_EXHAUSTED", err)
	}
	if got := tr.Get(PushbackTrailer); len(got) != 1 || got[0] != "250" {
		t.Fatalf("call 2 trailers %v, want %s: 250", tr, PushbackTrailer)
	}
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := c.UnaryCall(dctx, req); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call 3: %v, want DEADLINE_EXCEEDED", err)
	}
	resp, err := c.UnaryCall(metadata.AppendToOutgoingContext(ctx, "x-test", "4"), req)
	if err != nil || string(resp.GetPayload().GetBody()) != "hello" {
		t.Fatalf("call 4: %v %v, want the payload back", resp, err)
	}
	seen := s.WaitSeen(ctx, 4)
	if n := s.Executions(UnaryCall); n != 4 || len(seen) != 4 {
		t.Fatalf("%d executions, %d seen, want 4", n, len(seen))
	}
	var slow Seen
	for _, x := range seen {
		if x.N == 3 {
			slow = x
		}
		if x.N == 4 && (x.Metadata.Get("x-test")[0] != "4" || x.Status != codes.OK || x.Received != 5) {
			t.Errorf("call 4 seen as %+v", x)
		}
	}
	// The server's context ends at its deadline, or a moment earlier when
	// the client's RST_STREAM (CANCEL) at its own deadline arrives first.
	if slow.Deadline.IsZero() || time.Until(slow.Deadline) > 300*time.Millisecond || (slow.Status != codes.DeadlineExceeded && slow.Status != codes.Canceled) {
		t.Errorf("slow call seen with deadline %v status %v", slow.Deadline, slow.Status)
	}
}

// Unavailable is Trailers-Only on the wire: one HEADERS frame that ends
// the stream, with :status 200 and grpc-status 14, and no DATA.
func TestUnavailableIsTrailersOnly(t *testing.T) {
	s := Start(t, func(Call) Plan { return Plan{Fault: Unavailable} })
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	var msg bytes.Buffer
	msg.WriteByte(0)
	binary.Write(&msg, binary.BigEndian, uint32(0)) // an empty SimpleRequest
	req, _ := http.NewRequestWithContext(t.Context(), "POST", "http://"+s.Addr.String()+UnaryCall, &msg)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Grpc-Status") != "14" || len(body) != 0 || len(resp.Trailer) != 0 {
		t.Fatalf("status %d headers %v body %q trailers %v", resp.StatusCode, resp.Header, body, resp.Trailer)
	}
}

// Streaming both ways: every message of a server stream arrives in order;
// a client stream's bytes are all counted.
func TestStreaming(t *testing.T) {
	s := Start(t, nil)
	c := Client(t, s.Addr.String())
	ctx := t.Context()
	var params []*testpb.ResponseParameters
	for range 20 {
		params = append(params, &testpb.ResponseParameters{Size: 1000})
	}
	st, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{ResponseParameters: params})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(m.GetPayload().GetBody()) != 1000 || m.GetPayload().GetBody()[0] != byte(n) {
			t.Fatalf("message %d wrong", n)
		}
		n++
	}
	if n != 20 {
		t.Fatalf("%d messages, want 20", n)
	}
	in, err := c.StreamingInputCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chunk := []byte(strings.Repeat("x", 32<<10))
	for range 10 {
		if err := in.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: chunk}}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := in.CloseAndRecv()
	if err != nil || resp.GetAggregatedPayloadSize() != 320<<10 {
		t.Fatalf("%v %v, want %d bytes", resp, err, 320<<10)
	}
	if s.Executions(StreamingOutput) != 1 || s.Executions(StreamingInput) != 1 {
		t.Fatalf("executions %d %d", s.Executions(StreamingOutput), s.Executions(StreamingInput))
	}
}
