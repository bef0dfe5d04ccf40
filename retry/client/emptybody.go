package client

import (
	"io"
	"net/http"
	"strings"
)

// MarkEmptyBody gives a body-less request a body with no bytes that
// net/http cannot rewind: it keeps net/http from replaying the request by
// itself after a dead pooled connection. The body is an in-memory reader
// net/http knows, so the headers are not flushed on their own, and the
// Transfer-Encoding "identity" that goes with it means no chunked framing
// and no probe of the body: nothing of it reaches the wire. This client
// sends a marked request as the body-less request it is.
func MarkEmptyBody(req *http.Request) {
	req.Body = io.NopCloser(strings.NewReader(""))
	req.TransferEncoding = []string{"identity"}
}

// emptyBodyMarked reports a request that MarkEmptyBody marked.
func emptyBodyMarked(req *http.Request) bool {
	return req.ContentLength == 0 && len(req.TransferEncoding) == 1 && req.TransferEncoding[0] == "identity"
}
