package pods

// AmbiguousRequest is a pod's request egret answered ambiguous: it could
// not tell whether the upstream ran it, so it did not retry. A source that
// can tell the pod's owner (the Kubernetes source: a Warning Event) is
// handed one by the agent, made from the request's trace.
type AmbiguousRequest struct {
	RequestID string
	Method    string
	// URL is as the client addressed it; it may carry a query string.
	URL      string
	Upstream string
	Attempts int
}
