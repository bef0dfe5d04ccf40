package client

import (
	"errors"
	"fmt"
	"strings"
)

// h2ErrCode is an HTTP/2 error code (RFC 9113, section 7).
type h2ErrCode uint32

const (
	h2CodeInternal      h2ErrCode = 0x2
	h2CodeRefusedStream h2ErrCode = 0x7
	h2CodeCancel        h2ErrCode = 0x8
)

// h2StreamError mirrors net/http's unexported HTTP/2 stream error (an
// RST_STREAM, the peer's or our own). net/http gives that type an As method
// that fills any struct with the same field names and convertible field
// types (net/http/h2_error.go), so errors.As(err, &h2StreamError{}) finds
// one net/http returned without egret importing an HTTP/2 package. The
// field names and order are the contract: TestH2ErrorsOfNetHTTP pins them
// against net/http's real behaviour.
type h2StreamError struct {
	StreamID uint32
	Code     h2ErrCode
	Cause    error
}

func (e h2StreamError) Error() string {
	return fmt.Sprintf("http2 stream %d reset: code %d", e.StreamID, e.Code)
}

// h2ConnFault is what an HTTP/2 connection-level error says of a stream.
type h2ConnFault int

const (
	h2NoConnFault h2ConnFault = iota
	// h2Unusable: the connection would open no new stream (it was closing
	// or had a GOAWAY) when RoundTrip tried to open ours; nothing of the
	// request was written.
	h2Unusable
	// h2GoAwayRefused: a GOAWAY's last-stream-id is below our stream; the
	// server says it never processed it.
	h2GoAwayRefused
	// h2GoAwayClosed: the server sent a GOAWAY and closed the connection
	// with our stream at or below its last-stream-id: it may have run.
	h2GoAwayClosed
)

// h2ConnFaultOf reads the HTTP/2 connection-level errors of net/http's
// client. net/http only offers these as text: they are unexported
// errors.New values, a fmt.Errorf without %w, and an unexported GOAWAY
// error type without the As method its stream error has (h2_bundle.go:
// errClientConnUnusable, errClientConnGotGoAway, "received GOAWAY from
// server ErrCode", GoAwayError). So this is the one place that matches
// error text, on every error of err's chain; TestH2ErrorsOfNetHTTP makes
// each fault happen on a real net/http connection and checks that it is
// still read here, so a changed text fails a test instead of silently
// turning a refused stream into an ambiguous one.
func h2ConnFaultOf(err error) h2ConnFault {
	for ; err != nil; err = errors.Unwrap(err) {
		s := err.Error()
		switch {
		case s == "http2: client conn not usable":
			return h2Unusable
		case s == "http2: Transport received Server's graceful shutdown GOAWAY",
			strings.HasPrefix(s, "http2: Transport received GOAWAY from server ErrCode:"):
			return h2GoAwayRefused
		case strings.HasPrefix(s, "http2: server sent GOAWAY and closed the connection;"):
			return h2GoAwayClosed
		}
	}
	return h2NoConnFault
}

// StreamRefused reports whether err proves the server never processed the
// stream: REFUSED_STREAM, a GOAWAY below it, or a connection that opened
// no stream for it.
func StreamRefused(err error) bool {
	var se h2StreamError
	if errors.As(err, &se) && se.Code == h2CodeRefusedStream {
		return true
	}
	f := h2ConnFaultOf(err)
	return f == h2Unusable || f == h2GoAwayRefused
}

// PeerReset reports whether err is an HTTP/2 stream reset or GOAWAY the
// server sent. Our own cancellation never produces one: net/http ends a
// cancelled stream with the context's error (and a CANCEL reset it sends
// is excluded).
func PeerReset(err error) bool {
	var se h2StreamError
	return errors.As(err, &se) && se.Code != h2CodeCancel || h2ConnFaultOf(err) == h2GoAwayClosed
}
