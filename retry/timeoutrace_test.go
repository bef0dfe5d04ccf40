package retry

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/witness"
)

// stallWitness holds its first snapshot (the one the attempt timer takes
// when it freezes the connection) until release is closed, or 2 s pass.
type stallWitness struct {
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (w *stallWitness) Snapshot(syscall.RawConn) (witness.Counters, error) {
	w.once.Do(func() {
		close(w.entered)
		select {
		case <-w.release:
		case <-time.After(2 * time.Second):
		}
	})
	return witness.Counters{}, nil
}

// rawBase sends one request on a fresh TCP connection that it reports to
// the attempt (httptrace GotConn) wrapped for the witness, while it reads
// and writes the socket itself: closing the response body does not wait
// for the witness.
type rawBase struct {
	addr string
	w    witness.Witness
}

func (b rawBase) RoundTrip(req *http.Request) (*http.Response, error) {
	nc, err := net.Dial("tcp", b.addr)
	if err != nil {
		return nil, err
	}
	wc := attempt.NewConn(nc)
	wc.Arm(b.w)
	if ct := httptrace.ContextClientTrace(req.Context()); ct != nil && ct.GotConn != nil {
		ct.GotConn(httptrace.GotConnInfo{Conn: wc})
	}
	if err := req.Write(nc); err != nil {
		nc.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(nc), req)
	if err != nil {
		nc.Close()
		return nil, err
	}
	resp.Body = closeBoth{resp.Body, nc}
	return resp, nil
}

// closeBoth closes the socket with the body, not the witness's wrapper.
type closeBoth struct {
	io.ReadCloser
	c net.Conn
}

func (b closeBoth) Close() error {
	b.c.Close()
	return b.ReadCloser.Close()
}

// A response that arrives while the attempt timer is firing (it has marked
// itself fired and is freezing the connection, but has not cancelled the
// attempt's context yet) is an attempt timeout, never a nil response with
// a nil error (which crashed the runner).
func TestResponseRacingTheAttemptTimer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	w := &stallWitness{entered: make(chan struct{}), release: make(chan struct{})}
	defer close(w.release)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		// Answer once the timer has fired and is freezing the connection.
		<-w.entered
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
		time.Sleep(time.Second) // not synchronisation: the connection stays open a while, as a server's does
	}()

	var traces []*Trace
	tr := &Transport{
		Base: rawBase{addr: ln.Addr().String(), w: w},
		Policy: func(*http.Request) Policy {
			p := DefaultPolicy("")
			p.MaxAttempts = 1
			p.AttemptTimeout = 50 * time.Millisecond
			return p
		},
		OnTrace: func(tc *Trace) { traces = append(traces, tc) },
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/", nil)
	resp, err := func() (resp *http.Response, err error) {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("RoundTrip panicked: %v", p)
			}
		}()
		return tr.RoundTrip(req)
	}()
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got a %d response; want the attempt timeout", resp.StatusCode)
	}
	var re *Error
	if !errors.As(err, &re) || re.Outcome != engine.OutcomeFailed || re.Status != http.StatusGatewayTimeout {
		t.Fatalf("err %v; want failed with 504", err)
	}
	if len(traces) != 1 || len(traces[0].Attempts) != 1 || traces[0].Attempts[0].Failure != engine.ResponseTimeout {
		t.Fatalf("traces %+v; want one attempt ended response_timeout", traces)
	}
}

// peerResetBase answers with net/http's own error for a server that reset
// the stream after reading the request (err, made on a real connection by
// h2PeerResetError), but only once the attempt's timer has fired: the
// order a loaded machine produces, where RoundTrip's error is looked at
// after the timer. (The truth suite met it in CI: 504 for a 502.)
type peerResetBase struct {
	conn net.Conn
	err  error
}

func (b peerResetBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if ct := httptrace.ContextClientTrace(req.Context()); ct != nil {
		ct.GotConn(httptrace.GotConnInfo{Conn: b.conn})
		ct.WroteHeaders()
		ct.WroteRequest(httptrace.WroteRequestInfo{})
	}
	<-req.Context().Done()
	return nil, b.err
}

func TestPeerResetSeenAfterTheTimerIsAReset(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	var traces []*Trace
	tr := &Transport{
		Base: peerResetBase{conn: c1, err: h2PeerResetError(t)},
		Policy: func(*http.Request) Policy {
			p := DefaultPolicy("")
			p.MaxAttempts = 1
			p.AttemptTimeout = 20 * time.Millisecond
			return p
		},
		OnTrace: func(tc *Trace) { traces = append(traces, tc) },
	}
	req, _ := http.NewRequest(http.MethodPost, "http://upstream.test/", nil)
	_, err := tr.RoundTrip(req)
	var a *AmbiguousError
	if !errors.As(err, &a) || a.Status != http.StatusBadGateway {
		t.Fatalf("err %v; want ambiguous 502", err)
	}
	if len(traces) != 1 || traces[0].Attempts[0].Failure != engine.ConnectionReset {
		t.Fatalf("traces %+v; want one attempt ended connection_reset", traces[0].Attempts)
	}
}
