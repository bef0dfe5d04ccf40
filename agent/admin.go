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

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/retry"
	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/witness"
)

// DefaultAdminSocket is where `egret agent` serves its admin API.
const DefaultAdminSocket = "/run/egret/agent.sock"

// AdminSource is what an admin API answers from: the agent, or a lone
// proxy (Standalone).
type AdminSource interface {
	// AdminStatus is the summary (GET /status).
	AdminStatus() any
	// Pods is every pod's status (none for a lone proxy).
	Pods() []PodStatus
	// Upstreams is the node-wide budget of each upstream in use.
	Upstreams() []UpstreamStatus
	// Trace finds a recent request's trace and the pod it came from.
	Trace(id string) (retry.Trace, string, bool)
}

// AdminStatus implements AdminSource.
func (a *Agent) AdminStatus() any { return a.Status() }

// Admin returns the agent's admin API (AdminHandler).
func (a *Agent) Admin() http.Handler { return AdminHandler(a) }

// AdminHandler returns the admin API of src: JSON over HTTP, meant for a
// unix socket (ServeAdmin). Paths:
//
//	GET /status           the summary (Status, ProxyStatus)
//	GET /pods             []PodStatus
//	GET /pods/{name}      PodStatus
//	GET /upstreams        []UpstreamStatus (node-wide budgets in use)
//	GET /explain/{id}     TraceView of an Egret-Request-Id
//	GET /summary          Summary: per-pod and per-upstream counts and rates (a SummarySource's)
//	GET /observe, /policy see addObserve
func AdminHandler(src AdminSource) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, src.AdminStatus())
	})
	mux.HandleFunc("GET /pods", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, src.Pods())
	})
	mux.HandleFunc("GET /pods/{name...}", func(w http.ResponseWriter, r *http.Request) {
		for _, p := range src.Pods() {
			if p.Name == r.PathValue("name") {
				writeJSON(w, http.StatusOK, p)
				return
			}
		}
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("%v: %s", ErrNoPod, r.PathValue("name"))})
	})
	mux.HandleFunc("GET /upstreams", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, src.Upstreams())
	})
	mux.HandleFunc("GET /explain/{id}", func(w http.ResponseWriter, r *http.Request) {
		tr, pod, ok := src.Trace(r.PathValue("id"))
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no trace for request " + r.PathValue("id")})
			return
		}
		v := ViewTrace(tr)
		v.Pod = pod
		writeJSON(w, http.StatusOK, v)
	})
	handleSummary(mux, src)
	addObserve(mux, src) // GET /observe, GET /policy (admin_observe.go)
	return mux
}

// Standalone is the AdminSource of a lone proxy (`egret proxy --admin`):
// no pods, its server's traces and the budgets it was given.
type Standalone struct {
	Server  *proxy.Server
	Budgets *engine.Budgets
	// Status is the summary's fixed part; Traces is filled in.
	Status ProxyStatus
}

// ProxyStatus is a lone proxy's summary.
type ProxyStatus struct {
	Mode      string    `json:"mode"`
	Listen    string    `json:"listen"`
	Policy    string    `json:"policy"`
	Started   time.Time `json:"started"`
	Traces    int       `json:"traces"`
	Upstreams int       `json:"upstreams"`
}

// AdminStatus implements AdminSource.
func (s *Standalone) AdminStatus() any {
	st := s.Status
	st.Traces = s.Server.Traces().Len()
	s.Budgets.Sweep(time.Now())
	st.Upstreams = s.Budgets.Len()
	return st
}

// Pods implements AdminSource: a lone proxy has none.
func (s *Standalone) Pods() []PodStatus { return []PodStatus{} }

// Upstreams implements AdminSource.
func (s *Standalone) Upstreams() []UpstreamStatus { return upstreamsOf(s.Budgets) }

// Trace implements AdminSource.
func (s *Standalone) Trace(id string) (retry.Trace, string, bool) {
	tr, ok := s.Server.Traces().Get(id)
	return tr, "", ok
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// ServeAdmin serves the agent's admin API on a unix socket at path
// (ServeAdminHandler).
func (a *Agent) ServeAdmin(ctx context.Context, path string) error {
	return ServeAdminHandler(ctx, path, a.Admin())
}

// ServeAdminHandler serves h on a unix socket at path (replacing a stale
// socket file, mode 0600) until ctx ends, then removes the socket.
func ServeAdminHandler(ctx context.Context, path string, h http.Handler) error {
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
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
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

// TraceView is a request's trace as the admin API shows it (`egret
// explain --json`). Every field is always there, under a stable
// snake_case name; what is unknown is null.
type TraceView struct {
	RequestID  string    `json:"request_id"`
	Pod        string    `json:"pod"` // "" for a lone proxy
	Method     string    `json:"method"`
	URL        string    `json:"url"`
	Upstream   string    `json:"upstream"`
	Idempotent bool      `json:"idempotent"`
	Body       string    `json:"body"`
	Start      time.Time `json:"start"`
	// Outcome is what the caller was told: relayed (the response as it
	// is), ambiguous, not-sent or failed.
	Outcome  string        `json:"outcome"`
	Attempts []AttemptView `json:"attempts"`
	// Note: how the upstream was handled, when it says more than the
	// attempts (a Kubernetes Service egret leaves to kube-proxy).
	Note string `json:"note,omitempty"`
}

// AttemptView is one attempt of a TraceView, with the witness counters
// the evidence rests on.
type AttemptView struct {
	N          int       `json:"n"`
	Start      time.Time `json:"start"`
	DurationMs float64   `json:"duration_ms"`
	Stage      string    `json:"stage"`
	Failure    string    `json:"failure"` // "none" when a response arrived
	Evidence   string    `json:"evidence"`
	// Upgraded: the kernel witness proved not_sent where the stage alone
	// said sent_no_response.
	Upgraded bool   `json:"upgraded"`
	Status   int    `json:"status"` // 0: no response
	Err      string `json:"error"`
	Decision string `json:"decision"`
	Reason   string `json:"reason"` // "none" when no rule decided
	// WaitMs is the wait before the next attempt (a retry), else 0.
	WaitMs float64 `json:"wait_ms"`
	// Budget is the upstream's retry tokens when the decision was taken;
	// null: not consulted (a success).
	Budget        *float64 `json:"budget"`
	HiddenRetries int      `json:"hidden_retries"`
	// Endpoint is the Service endpoint the attempt dialled ("" when the
	// dial went to the destination the pod sent it to).
	Endpoint string `json:"endpoint,omitempty"`
	// WitnessBefore and WitnessAfter are the upstream socket's counters
	// when the request write started and when the attempt ended; null
	// when no witness read them.
	WitnessBefore *CountersView `json:"witness_before"`
	WitnessAfter  *CountersView `json:"witness_after"`
	// Proof is the witness's proof when Upgraded: "no_byte_left" or
	// "ended_before_ack" (the upstream's FIN acked no byte of the
	// request, and it reset them).
	Proof string `json:"proof,omitempty"`
	// Reused: the attempt went on a pooled connection, idle IdleMs.
	Reused bool    `json:"reused"`
	IdleMs float64 `json:"idle_ms"`
	// IdleBound: the upstream's idle bound applied to a request that is
	// not safely idempotent; null when none was.
	IdleBound *IdleBoundView `json:"idle_bound"`
}

// IdleBoundView is a attempt.IdleBound: pooled connections idle LimitMs or
// longer do not carry the request; Source ("keep-alive timeout", "close
// seen") and SeenMs tell where it was learned.
type IdleBoundView struct {
	LimitMs float64 `json:"limit_ms"`
	SeenMs  float64 `json:"seen_ms"`
	Source  string  `json:"source"`
}

// CountersView is a witness.Counters snapshot; a counter the witness
// could not read is null.
type CountersView struct {
	Source         string     `json:"source"` // "ebpf", "tcp_info"
	BytesSent      *uint64    `json:"bytes_sent"`
	DataSegsOut    *uint64    `json:"data_segs_out"`
	NotSentBytes   *uint64    `json:"notsent_bytes"`
	QueueDiscarded bool       `json:"queue_discarded"`
	BytesAcked     uint64     `json:"bytes_acked"`
	BytesReceived  *uint64    `json:"bytes_received"`
	Retransmits    uint32     `json:"retransmits"`
	RTOs           uint32     `json:"rtos"`
	ResetReceived  bool       `json:"reset_received"`
	ResetAt        *time.Time `json:"reset_at"`
	TCPState       uint8      `json:"tcp_state"` // linux TCP_* numbering; 0: unknown
}

// viewCounters renders c, nil when no witness read it.
func viewCounters(c witness.Counters) *CountersView {
	if c.Source == "" {
		return nil
	}
	opt := func(v uint64, ok bool) *uint64 {
		if !ok {
			return nil
		}
		return &v
	}
	v := &CountersView{
		Source: c.Source, BytesSent: opt(c.BytesSent, c.HasBytesSent), DataSegsOut: opt(c.DataSegsOut, c.HasDataSegsOut),
		NotSentBytes: opt(c.NotSentBytes, c.HasNotSentBytes), QueueDiscarded: c.QueueDiscarded, BytesAcked: c.BytesAcked,
		BytesReceived: opt(c.BytesReceived, c.HasBytesReceived), Retransmits: c.Retransmits, RTOs: c.RTOs,
		ResetReceived: c.ResetReceived, TCPState: c.State,
	}
	if !c.ResetAt.IsZero() {
		t := c.ResetAt
		v.ResetAt = &t
	}
	return v
}

// OutcomeRelayed is TraceView.Outcome of a response relayed as it is.
const OutcomeRelayed = "relayed"

// ViewTrace renders a trace for the admin API.
func ViewTrace(tr retry.Trace) TraceView {
	v := TraceView{
		RequestID: tr.RequestID, Method: tr.Method, URL: tr.URL, Upstream: tr.Upstream,
		Idempotent: tr.Idempotent, Body: tr.Body.String(), Start: tr.Start, Outcome: tr.Outcome.String(),
		Attempts: make([]AttemptView, 0, len(tr.Attempts)), Note: tr.Note,
	}
	if tr.Outcome == engine.OutcomeNone {
		v.Outcome = OutcomeRelayed
	}
	for _, at := range tr.Attempts {
		av := AttemptView{
			N: at.N, Start: at.Start, DurationMs: ms(at.Duration), Stage: at.Stage.String(), Failure: at.Failure.String(),
			Evidence: at.Evidence.String(), Upgraded: at.Upgraded, Status: at.Status, Err: at.Err,
			Decision: at.Decision.Decision.String(), Reason: at.Decision.Reason.String(),
			HiddenRetries: at.HiddenRetries, Endpoint: at.Endpoint,
			WitnessBefore: viewCounters(at.WitnessBefore), WitnessAfter: viewCounters(at.WitnessAfter),
			Reused: at.Reused, IdleMs: ms(at.Idle),
		}
		if at.Upgraded {
			av.Proof = at.Proof.String()
		}
		if b := at.IdleBound; b.Source != attempt.IdleBoundNone {
			av.IdleBound = &IdleBoundView{LimitMs: ms(b.Limit), SeenMs: ms(b.Seen), Source: b.Source.String()}
		}
		if av.Reason == "" {
			av.Reason = "none"
		}
		if at.Decision.Decision == engine.Retry {
			av.WaitMs = ms(at.Decision.Wait)
		}
		if at.BudgetRead {
			b := at.Budget
			av.Budget = &b
		}
		v.Attempts = append(v.Attempts, av)
	}
	return v
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
