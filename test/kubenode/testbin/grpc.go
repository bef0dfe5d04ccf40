package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The gRPC side of testbin: a backend of grpc-go's own server
// (grpc.testing.TestService, generated code that ships with grpc-go, so
// no protoc), a second listener that resets a stream after reading it,
// and a client of grpc-go's that calls either and says what came back.
//
// Metadata the backend reads of a call:
//
//	exec-id: ID          the call is executed by appending ID to DIR/NAME
//	                     (-record DIR; NAME the pod's hostname) before it is
//	                     answered
//	fault: unavailable-once
//	                     the first attempt of ID across every replica (the
//	                     one that creates DIR/once/ID) is answered
//	                     UNAVAILABLE, Trailers-Only, without executing it

// execRecord is where a backend records what it executes.
type execRecord struct {
	dir  string
	name string
	mu   sync.Mutex
	f    *os.File
}

func newExecRecord(dir, name string) (*execRecord, error) {
	if dir == "" {
		return &execRecord{name: name}, nil
	}
	if err := os.MkdirAll(filepath.Join(dir, "once"), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &execRecord{dir: dir, name: name, f: f}, nil
}

// exec records one execution of id: one append (one write(2)).
func (r *execRecord) exec(id string) error {
	if r.f == nil || id == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err := r.f.WriteString(id + "\n")
	return err
}

// first reports whether this is the first attempt of id any replica saw
// (it made DIR/once/ID; the directory is shared by the replicas).
func (r *execRecord) first(id string) (bool, error) {
	if r.dir == "" {
		return false, errors.New("no -record directory")
	}
	f, err := os.OpenFile(filepath.Join(r.dir, "once", id), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, os.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = f.WriteString(r.name + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err == nil, err
}

type testService struct {
	testgrpc.UnimplementedTestServiceServer
	rec *execRecord
}

func mdValue(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// admit applies the call's fault and executes it, or answers the fault.
func (s *testService) admit(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	id := mdValue(md, "exec-id")
	if mdValue(md, "fault") == "unavailable-once" && id != "" {
		first, err := s.rec.first(id)
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		if first {
			// No header sent yet: grpc-go answers Trailers-Only.
			return status.Errorf(codes.Unavailable, "%s: unavailable, once, for %s", s.rec.name, id)
		}
	}
	if err := s.rec.exec(id); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return grpc.SetHeader(ctx, metadata.Pairs("served-by", s.rec.name))
}

func (s *testService) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	if err := s.admit(ctx); err != nil {
		return nil, err
	}
	return &testgrpc.Empty{}, nil
}

func (s *testService) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	if err := s.admit(ctx); err != nil {
		return nil, err
	}
	return &testgrpc.SimpleResponse{Payload: req.GetPayload(), Hostname: s.rec.name}, nil
}

// StreamingOutputCall answers one message per ResponseParameters entry,
// each a payload of its size filled with its index.
func (s *testService) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	if err := s.admit(stream.Context()); err != nil {
		return err
	}
	for i, p := range req.GetResponseParameters() {
		body := bytes.Repeat([]byte{byte(i)}, int(p.GetSize()))
		if err := stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: body}}); err != nil {
			return err
		}
	}
	return nil
}

// grpcServe runs grpc-go's server on -listen and, on -reset-listen, an
// h2c server (net/http's) that reads a request to its end, executes it
// (its exec-id), and resets the stream (RST_STREAM INTERNAL_ERROR, no
// byte of an answer): a call that ran and whose caller cannot tell. A
// grpc-go server cannot be made to do that.
func grpcServe(args []string) {
	fs := flag.NewFlagSet("grpc-serve", flag.ExitOnError)
	listen := fs.String("listen", ":50051", "grpc-go's TestService")
	resetListen := fs.String("reset-listen", ":50052", "h2c: every request read, executed, then its stream reset")
	record := fs.String("record", "", "directory of the executions (shared by the replicas)")
	_ = fs.Parse(args)
	name, _ := os.Hostname()
	rec, err := newExecRecord(*record, name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, &testService{rec: rec})
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	reset := &http.Server{Addr: *resetListen, Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			panic(http.ErrAbortHandler)
		}
		if err := rec.exec(r.Header.Get("Exec-Id")); err != nil {
			fmt.Fprintln(os.Stderr, "reset: record:", err)
		}
		// Nothing written: net/http's HTTP/2 server resets the stream.
		panic(http.ErrAbortHandler)
	})}
	go func() { fmt.Fprintln(os.Stderr, reset.ListenAndServe()); os.Exit(1) }()
	fmt.Fprintln(os.Stderr, srv.Serve(ln))
	os.Exit(1)
}

// GRPCCall is one call's result as grpc-call prints it.
type GRPCCall struct {
	ID      string `json:"id"`
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
	// Attempts, RequestID, Outcome: egret's egret-attempts,
	// egret-request-id and egret-outcome; In says where they came: in the
	// response's header metadata ("header") or, for a Trailers-Only
	// answer, in its trailer ("trailer").
	Attempts  string `json:"attempts,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	Outcome   string `json:"outcome,omitempty"`
	In        string `json:"in,omitempty"`
	ServedBy  string `json:"served_by,omitempty"`
	// Messages is how many response messages came (stream), Intact
	// whether each was what was asked (unary: the payload echoed).
	Messages int     `json:"messages"`
	Intact   bool    `json:"intact"`
	MS       float64 `json:"ms"`
}

// GRPCResult is what grpc-call prints.
type GRPCResult struct {
	Calls  []GRPCCall     `json:"calls"`
	ByCode map[string]int `json:"by_code"`
	MS     float64        `json:"ms"`
}

// grpcCall makes -n calls, -c at a time, on one grpc-go client
// connection (one HTTP/2 connection: every call a stream of it), each
// with exec-id PREFIX-i and the -fault metadata, and prints their
// results as JSON.
func grpcCall(args []string) int {
	fs := flag.NewFlagSet("grpc-call", flag.ContinueOnError)
	n := fs.Int("n", 10, "calls")
	conc := fs.Int("c", 1, "calls at once")
	method := fs.String("method", "unary", "unary (UnaryCall) or stream (StreamingOutputCall, 5 messages of 16 KiB)")
	fault := fs.String("fault", "", "the fault metadata of each call")
	prefix := fs.String("id", "call", "exec-id prefix")
	size := fs.Int("size", 512, "unary: payload bytes")
	timeout := fs.Duration("timeout", 10*time.Second, "per call")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: testbin grpc-call [-n N] [-c C] [-method unary|stream] [-fault F] [-id PREFIX] HOST:PORT")
		return 2
	}
	conn, err := grpc.NewClient(fs.Arg(0), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	cl := testgrpc.NewTestServiceClient(conn)
	res := GRPCResult{Calls: make([]GRPCCall, *n), ByCode: map[string]int{}}
	start := time.Now()
	sem := make(chan struct{}, max(*conc, 1))
	var wg sync.WaitGroup
	for i := range *n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			id := *prefix + "-" + strconv.Itoa(i)
			ctx, cancel := context.WithTimeout(context.Background(), *timeout)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, "exec-id", id)
			if *fault != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "fault", *fault)
			}
			var hdr, trl metadata.MD
			r := GRPCCall{ID: id}
			sent := time.Now()
			switch *method {
			case "stream":
				got := 0
				r.Intact = true
				params := make([]*testgrpc.ResponseParameters, 5)
				for k := range params {
					params[k] = &testgrpc.ResponseParameters{Size: 16 << 10}
				}
				stream, serr := cl.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{ResponseParameters: params})
				if serr == nil {
					for {
						m, rerr := stream.Recv()
						if rerr != nil {
							if rerr != io.EOF {
								serr = rerr
							}
							break
						}
						if !bytes.Equal(m.GetPayload().GetBody(), bytes.Repeat([]byte{byte(got)}, 16<<10)) {
							r.Intact = false
						}
						got++
					}
					hdr, _ = stream.Header()
					trl = stream.Trailer()
				}
				r.Messages = got
				r.Intact = r.Intact && got == len(params) && serr == nil
				r.fill(serr, hdr, trl)
			default:
				body := []byte(fmt.Sprintf("%s %0*d", id, *size, i))
				resp, uerr := cl.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: body}}, grpc.Header(&hdr), grpc.Trailer(&trl))
				if uerr == nil {
					r.Messages = 1
					r.Intact = bytes.Equal(resp.GetPayload().GetBody(), body)
				}
				r.fill(uerr, hdr, trl)
			}
			r.MS = float64(time.Since(sent).Microseconds()) / 1000
			res.Calls[i] = r
		}()
	}
	wg.Wait()
	res.MS = float64(time.Since(start).Microseconds()) / 1000
	for _, c := range res.Calls {
		res.ByCode[c.Code]++
	}
	sort.Slice(res.Calls, func(a, b int) bool { return res.Calls[a].ID < res.Calls[b].ID })
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// fill records a call's status and egret's metadata, from the header or,
// for a Trailers-Only answer (grpc-go gives its fields as the trailer),
// from the trailer.
func (r *GRPCCall) fill(err error, hdr, trl metadata.MD) {
	st := status.Convert(err)
	r.Code, r.Message = st.Code().String(), st.Message()
	r.ServedBy = mdValue(hdr, "served-by")
	for _, x := range []struct {
		where string
		md    metadata.MD
	}{{"header", hdr}, {"trailer", trl}} {
		if a := mdValue(x.md, "egret-attempts"); a != "" && r.In == "" {
			r.In = x.where
			r.Attempts = a
			r.RequestID = mdValue(x.md, "egret-request-id")
			r.Outcome = mdValue(x.md, "egret-outcome")
		}
	}
}
