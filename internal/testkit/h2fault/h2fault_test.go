package h2fault

import (
	"bytes"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// rawPost sends one POST (headers, then a body of n bytes) with prior
// knowledge and returns the frames the server answered on the stream or
// the connection until the stream ended, a GOAWAY came, or the
// connection closed.
func rawPost(t *testing.T, s *Server, n int) []http2.Frame {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":authority", Value: "x"}, {Name: ":path", Value: "/p"}, {Name: "content-type", Value: "application/grpc"}} {
		enc.WriteField(f)
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	fr.WriteData(1, true, make([]byte, n))
	var got []http2.Frame
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return got
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
			continue
		case *http2.WindowUpdateFrame, *http2.PingFrame:
			continue
		case *http2.MetaHeadersFrame:
			got = append(got, f)
			if f.StreamEnded() {
				return got
			}
		case *http2.DataFrame:
			got = append(got, f)
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			return append(got, f)
		}
	}
}

func TestActionsOnTheWire(t *testing.T) {
	s := Start(t, Config{Plan: Sequence(Refuse, GoAwayBelow, ResetAfterRead, HeadersThenReset, Answer), GoAwayGrace: 100 * time.Millisecond})
	f := rawPost(t, s, 10)
	if r, ok := f[len(f)-1].(*http2.RSTStreamFrame); !ok || len(f) != 1 || r.ErrCode != http2.ErrCodeRefusedStream {
		t.Fatalf("refuse: %v", f)
	}
	f = rawPost(t, s, 10)
	if g, ok := f[len(f)-1].(*http2.GoAwayFrame); !ok || len(f) != 1 || g.LastStreamID != 0 {
		t.Fatalf("goaway below: %v", f)
	}
	f = rawPost(t, s, 10)
	if r, ok := f[len(f)-1].(*http2.RSTStreamFrame); !ok || len(f) != 1 || r.ErrCode != http2.ErrCodeInternal {
		t.Fatalf("reset after read: %v", f)
	}
	f = rawPost(t, s, 10)
	if h, ok := f[0].(*http2.MetaHeadersFrame); !ok || len(f) != 2 || h.PseudoValue("status") != "200" {
		t.Fatalf("headers then reset: %v", f)
	}
	if r, ok := f[1].(*http2.RSTStreamFrame); !ok || r.ErrCode != http2.ErrCodeInternal {
		t.Fatalf("headers then reset: %v", f)
	}
	f = rawPost(t, s, 70000) // more than the initial window: flow control works
	if len(f) != 3 {
		t.Fatalf("answer: %v", f)
	}
	if tr, ok := f[2].(*http2.MetaHeadersFrame); !ok || tr.Fields[0].Value != "0" || !tr.StreamEnded() {
		t.Fatalf("answer trailers: %v", f[2])
	}
	reqs := s.Requests()
	want := []bool{false, false, true, true, true}
	for i, r := range reqs {
		if r.Executed != want[i] || r.Path != "/p" || r.N != int64(i+1) {
			t.Errorf("%s: executed %v, path %q", r.Describe(), r.Executed, r.Path)
		}
	}
	if s.Executions() != 3 || len(reqs) != 5 || reqs[4].Body != 70000 {
		t.Fatalf("executions %d, requests %d, last body %d", s.Executions(), len(reqs), reqs[4].Body)
	}
}

// A real grpc-go client gets the answer's message; a refused stream is
// retried by grpc-go's own transparent retry (the stream was not
// processed), and the server counts one execution.
func TestGRPCClient(t *testing.T) {
	msg, _ := proto.Marshal(&testpb.SimpleResponse{Username: "h2fault"})
	s := Start(t, Config{Plan: Sequence(Refuse), Message: msg})
	cc, err := grpc.NewClient("passthrough:///"+s.Addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := testpb.NewTestServiceClient(cc).UnaryCall(t.Context(), &testpb.SimpleRequest{})
	if err != nil || resp.GetUsername() != "h2fault" {
		t.Fatalf("%v %v", resp, err)
	}
	if s.Executions() != 1 || len(s.Requests()) != 2 {
		t.Fatalf("executions %d, requests %d", s.Executions(), len(s.Requests()))
	}
	if p := s.Requests()[1].Path; p != "/grpc.testing.TestService/UnaryCall" {
		t.Fatalf("path %q", p)
	}
}
