package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/egret-proxy/egret/proxy/witness"
	"github.com/egret-proxy/egret/retry"
)

// DefaultAdminSocket is where `egret agent` serves its admin API.
const DefaultAdminSocket = "/run/egret/agent.sock"

// Admin returns the admin API: JSON over HTTP, meant for a unix socket
// (ServeAdmin). Paths:
//
//	GET /status           Status
//	GET /pods             []PodStatus
//	GET /pods/{name}      PodStatus
//	GET /upstreams        []UpstreamStatus (node-wide budgets)
//	GET /explain/{id}     TraceView of an Egret-Request-Id
func (a *Agent) Admin() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Status())
	})
	mux.HandleFunc("GET /pods", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Pods())
	})
	mux.HandleFunc("GET /pods/{name...}", func(w http.ResponseWriter, r *http.Request) {
		p, err := a.Pod(r.PathValue("name"))
		if err != nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, p)
	})
	mux.HandleFunc("GET /upstreams", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Upstreams())
	})
	mux.HandleFunc("GET /explain/{id}", func(w http.ResponseWriter, r *http.Request) {
		tr, pod, ok := a.Trace(r.PathValue("id"))
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no trace for request " + r.PathValue("id")})
			return
		}
		v := ViewTrace(tr)
		v.Pod = pod
		writeJSON(w, http.StatusOK, v)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// ServeAdmin serves the admin API on a unix socket at path (replacing a
// stale socket file) until ctx ends, then removes the socket.
func (a *Agent) ServeAdmin(ctx context.Context, path string) error {
	if err := os.MkdirAll(dirOf(path), 0o755); err != nil {
		return err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("agent: admin socket: %w", err)
	}
	_ = os.Chmod(path, 0o600)
	srv := &http.Server{Handler: a.Admin(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	err = srv.Serve(ln)
	os.Remove(path)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i > 0 {
		return p[:i]
	}
	return "."
}

// AdminClient is an HTTP client that talks to an admin socket; use URLs
// like http://egret/status.
func AdminClient(path string) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", path)
			},
		},
	}
}

// TraceView is a request's trace as the admin API shows it.
type TraceView struct {
	RequestID  string        `json:"request_id"`
	Pod        string        `json:"pod,omitempty"`
	Method     string        `json:"method"`
	URL        string        `json:"url"`
	Upstream   string        `json:"upstream"`
	Idempotent bool          `json:"idempotent"`
	Body       string        `json:"body"`
	Start      time.Time     `json:"start"`
	Outcome    string        `json:"outcome"`
	Attempts   []AttemptView `json:"attempts"`
}

// AttemptView is one attempt of a TraceView, with the witness counters
// the evidence rests on.
type AttemptView struct {
	N             int              `json:"n"`
	DurationMs    float64          `json:"duration_ms"`
	Stage         string           `json:"stage"`
	Failure       string           `json:"failure,omitempty"`
	Evidence      string           `json:"evidence"`
	Upgraded      bool             `json:"upgraded,omitempty"`
	Status        int              `json:"status,omitempty"`
	Err           string           `json:"error,omitempty"`
	Decision      string           `json:"decision"`
	Reason        string           `json:"reason"`
	Budget        *float64         `json:"budget,omitempty"` // absent: not consulted (a success)
	WitnessBefore witness.Counters `json:"witness_before"`
	WitnessAfter  witness.Counters `json:"witness_after"`
}

// ViewTrace renders a trace for the admin API.
func ViewTrace(tr retry.Trace) TraceView {
	v := TraceView{
		RequestID: tr.RequestID, Method: tr.Method, URL: tr.URL, Upstream: tr.Upstream,
		Idempotent: tr.Idempotent, Body: tr.Body.String(), Start: tr.Start, Outcome: tr.Outcome.String(),
	}
	for _, at := range tr.Attempts {
		av := AttemptView{
			N: at.N, DurationMs: float64(at.Duration.Microseconds()) / 1000, Stage: at.Stage.String(),
			Evidence: at.Evidence.String(), Upgraded: at.Upgraded, Status: at.Status, Err: at.Err,
			Decision: at.Decision.Decision.String(), Reason: at.Decision.Reason.String(),
			WitnessBefore: at.WitnessBefore, WitnessAfter: at.WitnessAfter,
		}
		if at.Failure != 0 {
			av.Failure = at.Failure.String()
		}
		if at.BudgetRead {
			b := at.Budget
			av.Budget = &b
		}
		v.Attempts = append(v.Attempts, av)
	}
	return v
}
