// Package proxy is the HTTP proxy egret puts in front of a workload: in
// explicit mode (an HTTP_PROXY, `egret proxy`) or transparent mode (per pod,
// behind the eBPF redirect, `egret agent`). It accepts HTTP/1.1 and h2c
// connections, sniffs other protocols through untouched, hands each
// request to the retry layer as one retry.Exchange (retry.Runner.Run, which
// asks the engine before each retry) and gets back one retry.Result, and
// tells the client the truth in the answer's headers (Egret-Request-Id,
// Egret-Attempts, Egret-Outcome). See README.md.
package proxy
