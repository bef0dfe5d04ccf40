package engine

// IdempotencyKeyHeader is the request header that, on an upstream that
// honours keys, makes a request idempotent (Idempotency.Resolve's hasKey).
const IdempotencyKeyHeader = "Idempotency-Key"

// Idempotency is the policy that resolves whether a request is safely
// idempotent (spec section 1). The method alone never decides when a policy
// says otherwise.
type Idempotency struct {
	// RouteSet says a route declared the request's idempotency as Route.
	RouteSet bool
	Route    bool
	// HonoursKeys: the upstream honours Idempotency-Key.
	HonoursKeys bool
	// MethodDefaultOff: the upstream turned the RFC 9110 method default off.
	MethodDefaultOff bool
}

// Resolve answers for a request with this method; hasKey says it carries an
// Idempotency-Key header.
func (p Idempotency) Resolve(method string, hasKey bool) bool {
	switch {
	case p.RouteSet:
		return p.Route
	case hasKey && p.HonoursKeys:
		return true
	case p.MethodDefaultOff:
		return false
	}
	return MethodIdempotent(method)
}

// MethodIdempotent reports whether RFC 9110 defines the method as
// idempotent: GET, HEAD, OPTIONS, TRACE, PUT and DELETE.
func MethodIdempotent(method string) bool {
	switch method {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}
