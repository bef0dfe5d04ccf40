package client

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

// h2BaseError sends one POST straight on HTTPTransport (h2c, no retry
// Transport) to a raw HTTP/2 server that does a to it, and returns
// RoundTrip's error: net/http's own, as egret's classifier receives it.
func h2BaseError(t *testing.T, a rawtest.H2Action) error {
	t.Helper()
	base := NewHTTPTransport(HTTPOptions{H2C: true})
	t.Cleanup(base.CloseIdleConnections)
	return rawtest.H2Error(t, base, a)
}

// h2PeerResetError is net/http's error for a stream the server reset with
// INTERNAL_ERROR after reading the whole request.
func h2PeerResetError(t *testing.T) error { return h2BaseError(t, rawtest.H2ResetAfterRead) }

// TestH2ErrorsOfNetHTTP pins egret's reading of net/http's HTTP/2 errors
// (h2err.go) against what net/http really returns for each fault: the
// stream error through the mirror struct (all three fields: net/http's As
// fills it only if every field name matches), the rest by their text.
func TestH2ErrorsOfNetHTTP(t *testing.T) {
	for _, c := range []struct {
		name      string
		action    rawtest.H2Action
		code      h2ErrCode // 0: not a stream error
		fault     h2ConnFault
		refused   bool
		PeerReset bool
	}{
		{"REFUSED_STREAM", rawtest.H2Refuse, h2CodeRefusedStream, h2NoConnFault, true, true},
		{"RST_STREAM after the request", rawtest.H2ResetAfterRead, h2CodeInternal, h2NoConnFault, false, true},
		{"GOAWAY below the stream", rawtest.H2GoAwayBelow, 0, h2GoAwayRefused, true, false},
		{"GOAWAY below the stream, with an error code", rawtest.H2GoAwayBelowErr, 0, h2GoAwayRefused, true, false},
		{"GOAWAY covering the stream, then close", rawtest.H2GoAwayCovers, 0, h2GoAwayClosed, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := h2BaseError(t, c.action)
			var se h2StreamError
			isStream := errors.As(err, &se)
			if isStream != (c.code != 0) {
				t.Fatalf("err %v (%T): stream error %v, want %v", err, err, isStream, c.code != 0)
			}
			if isStream && (se.Code != c.code || se.StreamID != 1 || se.Cause == nil) {
				t.Fatalf("stream error %+v, want stream 1, code %d and the peer as its cause", se, c.code)
			}
			if f := h2ConnFaultOf(err); f != c.fault {
				t.Fatalf("err %q: connection fault %d, want %d", err, f, c.fault)
			}
			if StreamRefused(err) != c.refused || PeerReset(err) != c.PeerReset {
				t.Fatalf("err %q: refused %v PeerReset %v, want %v %v", err, StreamRefused(err), PeerReset(err), c.refused, c.PeerReset)
			}
		})
	}
	t.Run("other errors", func(t *testing.T) {
		for _, err := range []error{errors.New("http2: something else"), context.Canceled, net.ErrClosed} {
			if h2ConnFaultOf(err) != h2NoConnFault || StreamRefused(err) || PeerReset(err) {
				t.Fatalf("%v read as an HTTP/2 fault", err)
			}
		}
	})
}

// TestH2UnusableConnOfNetHTTP: a stream reserved on a connection that then
// gets a GOAWAY fails in net/http's RoundTrip before it is opened ("client
// conn not usable"): read as h2Unusable, which the pool answers by taking
// another connection and the classifier as refused_stream.
func TestH2UnusableConnOfNetHTTP(t *testing.T) {
	goAway := make(chan struct{})
	pinged := make(chan struct{})
	srv := rawtest.NewServer(t, func(c net.Conn, _ int) {
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(c, preface); err != nil {
			return
		}
		fr := http2.NewFramer(c, c)
		if fr.WriteSettings() != nil {
			return
		}
		<-goAway
		// The client handles frames in order: its answer to the PING
		// proves it has taken the GOAWAY in.
		fr.WriteGoAway(0, http2.ErrCodeNo, nil)
		fr.WritePing(false, [8]byte{'g', 'o', 'a', 'w', 'a', 'y'})
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					fr.WriteSettingsAck()
				}
			case *http2.PingFrame:
				if f.IsAck() {
					close(pinged) // then keep the connection open
				}
			}
		}
	})
	base := NewHTTPTransport(HTTPOptions{H2C: true})
	t.Cleanup(base.CloseIdleConnections)
	c, _, _, err := base.h2.get(t.Context(), srv.Addr(), false, nil, attempt.IdleBound{})
	if err != nil {
		t.Fatal(err)
	}
	close(goAway)
	select {
	case <-pinged:
	case <-time.After(10 * time.Second):
		t.Fatal("no PING ack after the GOAWAY")
	}
	resp, err := c.cc.RoundTrip(rawtest.Get(t, srv.URL()))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("status %d on a connection after its GOAWAY", resp.StatusCode)
	}
	if h2ConnFaultOf(err) != h2Unusable || !StreamRefused(err) || PeerReset(err) {
		t.Fatalf("err %q: fault %d refused %v PeerReset %v, want unusable, refused, no peer reset", err, h2ConnFaultOf(err), StreamRefused(err), PeerReset(err))
	}
	if srv.Conns() != 1 {
		t.Fatalf("conns %d", srv.Conns())
	}
}
