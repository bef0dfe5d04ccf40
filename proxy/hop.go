package proxy

import (
	"net/http"
	"net/textproto"
	"slices"
	"strings"
)

// hopHeaders are the hop-by-hop headers of RFC 9110 section 7.6.1 that a
// proxy never forwards, plus the proxy's own request controls.
var hopHeaders = []string{
	"Connection",
	"Proxy-Connection",
	"Keep-Alive",
	"Te",
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
	HeaderTimeoutMs,
}

// removeHopHeaders deletes from h the hop-by-hop headers, every header named
// by a Connection header but the message's framing, every Proxy-* header,
// and every Egret-* header: a client's are egret's inputs (Egret-Timeout-Ms,
// read before) or forgeries of what egret says (Egret-Outcome,
// Egret-Attempts), and an upstream must see only egret's own
// (Egret-Request-Id, set after).
func removeHopHeaders(h http.Header) {
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				// h.Del(f), without allocating for a name sent in
				// lower case (keep-alive).
				if k, ok := canonicalKey(f); ok {
					f = k
				}
				if !framing(f) {
					delete(h, f)
				}
			}
		}
	}
	for k := range h {
		if strings.HasPrefix(k, "Proxy-") || isEgretField(k) || slices.Contains(hopHeaders, k) {
			delete(h, k)
		}
	}
}

// isEgretField reports whether the field name k is one of egret's own
// (Egret-*, in any case).
func isEgretField(k string) bool {
	return len(k) >= len("Egret-") && strings.EqualFold(k[:len("Egret-")], "Egret-")
}

// framing reports whether the field k (canonical or not) frames the
// message (RFC 9112 section 6): a Connection field naming it never takes
// it away, since the body it frames still comes, and without it the next
// hop would read that body as the next message. (Transfer-Encoding is
// hop-by-hop anyway: the body is framed again for the next hop from what
// was read, never from the field.)
func framing(k string) bool {
	return asciiEqualFold(k, "Content-Length") || asciiEqualFold(k, "Transfer-Encoding")
}
