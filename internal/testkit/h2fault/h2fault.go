// Package h2fault is a raw HTTP/2 server for tests (prior knowledge over
// cleartext, h2c), written on golang.org/x/net/http2's Framer so that it
// can do on purpose what a real server only does by accident: refuse a
// stream (RST_STREAM REFUSED_STREAM) before reading it, send a GOAWAY whose
// last-stream-id is below the stream, reset a stream after reading the
// whole request, or send response headers and then reset. It also answers
// normally, in gRPC's shape (HEADERS :status 200 application/grpc, one
// length-prefixed message, trailers grpc-status 0), so that a real gRPC
// client can talk to it through a proxy.
//
// It counts executions: a request counts once its whole request (to
// END_STREAM) was read, the point after which a server may have acted on
// it. Refused streams and streams above a GOAWAY's last-stream-id never
// count (RFC 9113 §8.7: they were not processed).
package h2fault

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Action is what the server does with a request stream.
type Action int

const (
	// Answer reads the request whole and answers it in gRPC's shape
	// (executed).
	Answer Action = iota
	// Refuse sends RST_STREAM REFUSED_STREAM on the request's HEADERS,
	// before reading anything more (not executed).
	Refuse
	// GoAwayBelow sends GOAWAY (NO_ERROR) with the last-stream-id just
	// below the stream's, and closes the connection after a grace
	// period (not executed).
	GoAwayBelow
	// ResetAfterRead reads the request whole, then sends RST_STREAM
	// INTERNAL_ERROR (executed, no answer).
	ResetAfterRead
	// HeadersThenReset reads the request whole, sends the response
	// HEADERS (:status 200, application/grpc) and then RST_STREAM
	// INTERNAL_ERROR (executed, a partial answer).
	HeadersThenReset
)

func (a Action) String() string {
	switch a {
	case Answer:
		return "answer"
	case Refuse:
		return "refuse"
	case GoAwayBelow:
		return "goaway_below"
	case ResetAfterRead:
		return "reset_after_read"
	case HeadersThenReset:
		return "headers_then_reset"
	}
	return "action?"
}

// Request is one request stream as the server saw it.
type Request struct {
	// N counts the request streams the server was sent, from 1, across
	// its connections.
	N int64
	// Conn counts the server's connections, from 1.
	Conn int
	// StreamID is the stream's id on its connection.
	StreamID uint32
	// Path is the :path pseudo-header.
	Path string
	// Header holds every field of the request's header block, pseudo-
	// headers included, in order.
	Header []hpack.HeaderField
	// Action is what the planner chose for it.
	Action Action
	// Body is the request body's length read (the whole body when
	// Executed).
	Body int
	// Executed is true once the request was read whole by an action that
	// reads it.
	Executed bool
}

// Get returns the value of the request's first header field name, or "".
func (r Request) Get(name string) string {
	for _, f := range r.Header {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// Planner chooses the Action of the n-th request stream (from 1) to path.
// It is called from the connections' goroutines, concurrently.
type Planner func(n int64, path string) Action

// Sequence is a Planner giving the n-th request actions[n-1], and Answer
// to the requests after the last.
func Sequence(actions ...Action) Planner {
	return func(n int64, _ string) Action {
		if n <= int64(len(actions)) {
			return actions[n-1]
		}
		return Answer
	}
}

// Config is how a Server behaves.
type Config struct {
	// Plan chooses each request's action (nil: Answer every request).
	Plan Planner
	// Message is the serialized protobuf message Answer sends (nil: an
	// empty message, which every proto3 message type decodes).
	Message []byte
	// GoAwayGrace is how long the server keeps a connection open after
	// its GOAWAY for the streams below the last-stream-id to finish, as a
	// real server does (0: 1 s).
	GoAwayGrace time.Duration
}

// Server is a running raw HTTP/2 server.
type Server struct {
	// Addr is where it listens (loopback).
	Addr netip.AddrPort

	cfg   Config
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	n     int64
	conns int
	reqs  []*Request
	open  map[net.Conn]struct{}
}

// Start serves on a loopback port until the test ends.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Plan == nil {
		cfg.Plan = func(int64, string) Action { return Answer }
	}
	if cfg.GoAwayGrace == 0 {
		cfg.GoAwayGrace = time.Second
	}
	s := &Server{Addr: ln.Addr().(*net.TCPAddr).AddrPort(), cfg: cfg, ln: ln, open: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.Close)
	return s
}

// Close stops the server and ends its connections.
func (s *Server) Close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.open {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Requests returns a copy of every request stream seen so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = *r
	}
	return out
}

// Executions returns how many requests were read whole by an action that
// reads them (Answer, ResetAfterRead, HeadersThenReset).
func (s *Server) Executions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.reqs {
		if r.Executed {
			n++
		}
	}
	return n
}

// Conns returns how many connections the server accepted.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns++
		id := s.conns
		s.open[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				c.Close()
				s.mu.Lock()
				delete(s.open, c)
				s.mu.Unlock()
			}()
			s.serve(c, id)
		}()
	}
}

// serve speaks HTTP/2 on one connection, every frame read and written by
// this goroutine.
func (s *Server) serve(c net.Conn, connID int) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	if err := fr.WriteSettings(); err != nil {
		return
	}
	streams := map[uint32]*Request{}
	goingAway := false
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	headers := func(id uint32, end bool, fields ...hpack.HeaderField) error {
		hb.Reset()
		for _, f := range fields {
			enc.WriteField(f)
		}
		return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: end})
	}
	// finish does a stream's action once its request was read whole; an
	// error ends the connection.
	finish := func(r *Request) error {
		delete(streams, r.StreamID)
		s.mu.Lock()
		r.Executed = true
		s.mu.Unlock()
		switch r.Action {
		case ResetAfterRead:
			return fr.WriteRSTStream(r.StreamID, http2.ErrCodeInternal)
		case HeadersThenReset:
			if err := headers(r.StreamID, false, grpcHeaders()...); err != nil {
				return err
			}
			return fr.WriteRSTStream(r.StreamID, http2.ErrCodeInternal)
		}
		if err := headers(r.StreamID, false, grpcHeaders()...); err != nil {
			return err
		}
		msg := make([]byte, 5+len(s.cfg.Message))
		binary.BigEndian.PutUint32(msg[1:5], uint32(len(s.cfg.Message)))
		copy(msg[5:], s.cfg.Message)
		if err := fr.WriteData(r.StreamID, false, msg); err != nil {
			return err
		}
		return headers(r.StreamID, true,
			hpack.HeaderField{Name: "grpc-status", Value: "0"},
			hpack.HeaderField{Name: "grpc-message", Value: ""})
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := fr.WriteSettingsAck(); err != nil {
					return
				}
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				if err := fr.WritePing(true, f.Data); err != nil {
					return
				}
			}
		case *http2.RSTStreamFrame:
			delete(streams, f.StreamID)
		case *http2.MetaHeadersFrame:
			if goingAway {
				continue // above the last-stream-id: ignored (RFC 9113 §6.8)
			}
			id := f.StreamID
			if _, ok := streams[id]; ok {
				continue // trailers of a request: its end is handled below
			}
			s.mu.Lock()
			s.n++
			r := &Request{N: s.n, Conn: connID, StreamID: id, Path: f.PseudoValue("path"), Header: append([]hpack.HeaderField(nil), f.Fields...)}
			s.reqs = append(s.reqs, r)
			s.mu.Unlock()
			a := s.cfg.Plan(r.N, r.Path)
			s.mu.Lock()
			r.Action = a
			s.mu.Unlock()
			switch a {
			case Refuse:
				if err := fr.WriteRSTStream(id, http2.ErrCodeRefusedStream); err != nil {
					return
				}
				continue
			case GoAwayBelow:
				if err := fr.WriteGoAway(id-1, http2.ErrCodeNo, nil); err != nil {
					return
				}
				// The streams below it may finish; the connection ends
				// when the client closes it or after the grace period, as
				// a real server's does. (Not at once: a close with frames
				// unread resets the connection, and the client may lose
				// the GOAWAY.)
				goingAway = true
				c.SetReadDeadline(time.Now().Add(s.cfg.GoAwayGrace))
				continue
			}
			streams[id] = r
			if f.StreamEnded() {
				if finish(r) != nil {
					return
				}
			}
		case *http2.DataFrame:
			r := streams[f.StreamID]
			if n := len(f.Data()); n > 0 {
				// Flow control: what was read may be sent again.
				if err := fr.WriteWindowUpdate(0, uint32(f.Length)); err != nil {
					return
				}
				if r != nil && !f.StreamEnded() {
					if err := fr.WriteWindowUpdate(f.StreamID, uint32(f.Length)); err != nil {
						return
					}
				}
				if r != nil {
					s.mu.Lock()
					r.Body += n
					s.mu.Unlock()
				}
			}
			if r != nil && f.StreamEnded() {
				if finish(r) != nil {
					return
				}
			}
		}
	}
}

func grpcHeaders() []hpack.HeaderField {
	return []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"}}
}

// Describe names a request for a test's message.
func (r Request) Describe() string {
	return "request " + strconv.FormatInt(r.N, 10) + " " + r.Path + " (" + r.Action.String() + ")"
}
