package cli

import (
	"net/http"
	"sync/atomic"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/dashboard"
)

// nodePage is the node page (agent/dashboard) of src, served on the
// --metrics address beside /metrics.
func nodePage(src interface {
	agent.SummarySource
	dashboard.Tracer
}) http.Handler {
	return dashboard.Handler(agent.NewSummarizer(src), src)
}

// lateHandler serves the handler set once it exists (egret proxy serves
// its metrics address before its server is made), 503 before.
type lateHandler struct{ h atomic.Pointer[http.Handler] }

func (l *lateHandler) set(h http.Handler) { l.h.Store(&h) }

func (l *lateHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := l.h.Load()
	if h == nil {
		http.Error(w, "starting", http.StatusServiceUnavailable)
		return
	}
	(*h).ServeHTTP(w, r)
}
