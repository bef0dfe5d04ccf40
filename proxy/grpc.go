package proxy

import (
	"net/http"
	"strconv"
	"time"

	"github.com/egret-proxy/egret/engine"
)

// gRPC over HTTP/2 (the gRPC protocol's "PROTOCOL-HTTP2" document): what
// the proxy reads of a call and how it answers one itself.
const (
	// headerGRPCTimeout bounds the call's deadline, as HeaderTimeoutMs
	// does (it never lengthens the policy's).
	headerGRPCTimeout = "Grpc-Timeout"
	headerGRPCStatus  = "Grpc-Status"
	headerGRPCMessage = "Grpc-Message"
)

// gRPC status codes egret answers with (google.golang.org/grpc/codes;
// the numbers are the protocol's).
const (
	grpcUnknown          = 2
	grpcInvalidArgument  = 3
	grpcDeadlineExceeded = 4
	grpcPermissionDenied = 7
	grpcResourceExhaust  = 8
	grpcUnimplemented    = 12
	grpcInternal         = 13
	grpcUnavailable      = 14
	grpcUnauthenticated  = 16
)

// grpcTimeout parses a Grpc-Timeout value: at most 8 digits and a unit
// (H, M, S, m, u, n). A zero timeout is the shortest one there is.
func grpcTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	unit := map[byte]time.Duration{'H': time.Hour, 'M': time.Minute, 'S': time.Second,
		'm': time.Millisecond, 'u': time.Microsecond, 'n': time.Nanosecond}[v[len(v)-1]]
	if unit == 0 {
		return 0, false
	}
	return max(time.Duration(n)*unit, time.Nanosecond), true
}

// grpcCode is the status of a gRPC call egret answers itself. The outcome
// decides first: not_sent is UNAVAILABLE, the code gRPC clients retry (no
// byte of the call reached the upstream); ambiguous is UNKNOWN, never
// UNAVAILABLE, so that no standard retry policy sends again a call that
// may have run. Otherwise the HTTP status maps as gRPC maps one it gets
// from an HTTP/2 peer that is not gRPC, but for 502 and 503: a failure
// egret could not retry is not one a client should, UNKNOWN.
func grpcCode(outcome string, status int) int {
	switch outcome {
	case engine.OutcomeNotSent.String():
		return grpcUnavailable
	case engine.OutcomeAmbiguous.String():
		return grpcUnknown
	}
	switch status {
	case http.StatusBadRequest, http.StatusRequestHeaderFieldsTooLarge:
		return grpcInvalidArgument
	case http.StatusUnauthorized:
		return grpcUnauthenticated
	case http.StatusForbidden:
		return grpcPermissionDenied
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return grpcUnimplemented
	case http.StatusRequestTimeout, http.StatusGatewayTimeout:
		return grpcDeadlineExceeded
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return grpcResourceExhaust
	case http.StatusInternalServerError:
		return grpcInternal
	}
	return grpcUnknown
}

// grpcMessage percent-encodes msg as Grpc-Message wants: printable ASCII
// but "%" as it is, every other byte as %XX.
func grpcMessage(msg string) string {
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(msg))
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c >= ' ' && c <= '~' && c != '%' {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hex[c>>4], hex[c&15])
	}
	return string(b)
}
