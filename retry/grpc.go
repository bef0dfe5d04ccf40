package retry

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// gRPC status codes the status rules read (google.golang.org/grpc/codes;
// the numbers are the protocol's).
const (
	grpcResourceExhausted = "8"
	grpcUnavailable       = "14"
)

// IsGRPC reports whether h, a request's or a response's header, is a gRPC
// call's: its content type is application/grpc, alone or with a "+" or
// ";" suffix.
func IsGRPC(h http.Header) bool {
	ct := h.Get("Content-Type")
	rest, ok := strings.CutPrefix(ct, "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

// grpcRule is how the status rules read a gRPC call's answer that is
// Trailers-Only (its grpc-status in the response's header: the call ended
// with its headers), when the call is idempotent (its method declared so
// by the policy; a gRPC call is a POST), as gRPC's own retry design
// (proposal A6) reads it:
//   - UNAVAILABLE as 503;
//   - RESOURCE_EXHAUSTED as 429, its grpc-retry-pushback-ms (when there)
//     the Retry-After; a pushback that is negative or not a number is the
//     server asking not to be retried: the answer stays what it is.
//
// ok is false for every other answer: the rules read its :status.
func grpcRule(resp *http.Response) (status int, wait time.Duration, hasWait, ok bool) {
	if !IsGRPC(resp.Header) {
		return 0, 0, false, false
	}
	switch resp.Header.Get("Grpc-Status") {
	case grpcUnavailable:
		return http.StatusServiceUnavailable, 0, false, true
	case grpcResourceExhausted:
		v, has := resp.Header["Grpc-Retry-Pushback-Ms"]
		if !has || len(v) == 0 {
			return http.StatusTooManyRequests, 0, false, true
		}
		ms, err := strconv.ParseInt(strings.TrimSpace(v[0]), 10, 64)
		if err != nil || ms < 0 {
			return 0, 0, false, false
		}
		return http.StatusTooManyRequests, time.Duration(min(ms, 1<<40)) * time.Millisecond, true, true
	}
	return 0, 0, false, false
}
