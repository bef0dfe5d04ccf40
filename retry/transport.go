package retry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/retry/client"
	"github.com/egret-proxy/egret/witness"
)

// HeaderOutcome marks a relayed response whose status is ambiguous (a
// 502-504 answer to a non-idempotent request).
const HeaderOutcome = "Egret-Outcome"

// HeaderRequestID is the request header a request's Trace.RequestID is
// read from (the proxy sets it on every request it forwards).
const HeaderRequestID = "Egret-Request-Id"

// DefaultKeepBody is how much of a retried response's body is buffered so
// that the response can still be returned when later attempts fail
// without one.
const DefaultKeepBody = 64 << 10

// Exchange is one request handed to the retry layer: everything its
// attempts need, given explicitly by the caller. The node proxy builds one
// per request and calls Runner.Run with it (Transport makes the same run
// from its own fields, for Go programs). Nothing of the caller is reached
// through the request's context or through callbacks: the context only
// cancels.
//
// An Exchange is run once and must not be copied once run: it also holds
// the run's state (its trace, its first attempt), so that the caller's one
// allocation serves the whole request.
type Exchange struct {
	// Request is the request to send upstream. Its body is read by the
	// first attempt; GetBody reopens it for a retry (BodyKind tells which
	// bodies can be). Its context cancels the attempts; nothing is looked
	// up in it.
	Request *http.Request
	// Policy is what the request's upstream allows; Policy.Upstream names
	// its budget (empty: the URL's host:port).
	Policy Policy
	// Base is the transport the attempts run on (nil: the Runner's).
	Base *client.HTTPTransport
	// FieldOrder is the request's header field names as the client sent
	// them, one per field line, in the order sent: HTTP/1.1 writes the
	// fields in that order and with those names, then the fields it does
	// not name (added by the caller) by canonical name. nil: all by name.
	FieldOrder []string
	// Bulkhead, when set, is held for each attempt (never while waiting
	// before a retry); a failure to enter it is the attempt's
	// pool_timeout.
	Bulkhead Bulkhead
	// Endpoints, when set, chooses the address each attempt dials: the
	// upstream is several servers (a Kubernetes Service's endpoints). The
	// request's URL and Host header keep naming the upstream; only the
	// dial (and the pooled connection) is the endpoint's.
	Endpoints Endpoints
	// Note is the caller's word on how the upstream was handled, recorded
	// as the trace's Note when the run begins (the proxy's: a Kubernetes
	// Service egret leaves to kube-proxy).
	Note string

	run run // the run's state, in the caller's allocation
}

// Endpoints chooses the server each attempt of one exchange goes to, when
// the upstream is several (a Kubernetes Service's endpoints). One value
// serves one exchange: it remembers the endpoints that failed it, so that
// a retry goes elsewhere while another endpoint is available. Its calls
// alternate (Pick, Done, Pick, Done...), from the run's goroutine.
type Endpoints interface {
	// Pick returns the host:port the next attempt dials. ok false: no
	// endpoint is available; the attempt fails not_sent (ErrNoEndpoint),
	// permanently, and nothing is dialled.
	Pick() (addr string, ok bool)
	// Done tells how the attempt on the address Pick returned ended: failed
	// when it got no response (a refused or timed-out connect, a reset, a
	// timeout) or a 5xx.
	Done(failed bool)
}

// Bulkhead bounds the attempts in flight to an upstream.
type Bulkhead interface {
	// Enter takes a permit for one attempt, waiting at most as long as
	// ctx lets it.
	Enter(ctx context.Context) error
	// Leave gives back the permit Enter took.
	Leave()
}

// Result is how an exchange ended: a Response to relay, or an Err
// (*AmbiguousError or *Error) without one. Trace is the request's history
// (its Outcome the engine's).
//
// A Runner's run ends in one call, Finish: once the Response's body was
// read to its end, broke, or is abandoned (and closed), Finish completes
// the run and returns its final trace. Until then the run holds the
// attempt the response came from (its bulkhead permit, its context);
// nothing changes the trace after Finish. With an Err, or a 101 whose
// body is the connection, the run is complete when Run returns, and
// Finish only returns the trace.
type Result struct {
	Response *http.Response
	Err      error
	Trace    *Trace

	run *run // nil: nothing left to complete (a stand-in's Result)
}

// Finish completes the run and returns its final trace. bodyErr is the
// error the Response's body returned to its reader: nil when it was read
// to its end (io.EOF counts as nil), or abandoned unread; another error
// says the body broke after the response was returned, which the trace
// records on the last attempt (body_interrupted, partial response; no
// retry). The body must be closed first. Only the first call counts.
func (r Result) Finish(bodyErr error) *Trace {
	if r.run == nil {
		return r.Trace
	}
	return r.run.finish(bodyErr)
}

// Runner runs exchanges (Run): the state they share, one per process (the
// agent's is node-wide). The zero value is usable; fields must not change
// once exchanges run.
type Runner struct {
	// Budgets holds the per-upstream retry budgets. nil: a private registry.
	Budgets *engine.Budgets
	// Witness, when set, may upgrade sent_no_response to not_sent with
	// proof from the kernel that no byte of the attempt left the host
	// (connections of client.HTTPTransport only: they freeze at a failure so
	// that the proof holds). With it, a non-idempotent request is never
	// written on a pooled HTTP/1.1 connection the upstream already closed:
	// the attempt fails before its first byte, provably not_sent.
	Witness witness.Witness
	// Draining, when set and true, denies new retries (runtime_draining).
	Draining *atomic.Bool
	// Rand is the jitter's source. nil: engine.DefaultRand.
	Rand engine.Rand
	// Now is the clock of the trace and the budget. nil: time.Now.
	Now func() time.Time
	// Sleep waits d before a retry, returning early with an error when ctx
	// is done. nil: a timer.
	Sleep func(ctx context.Context, d time.Duration) error
	// KeepBody bounds the buffered body of a retried response kept in case
	// later attempts fail without one (0: DefaultKeepBody; < 0: keep none).
	KeepBody int64
	// Metrics, when set, counts attempts, decisions, outcomes and upgrades.
	Metrics *Metrics

	once    sync.Once
	budgets *engine.Budgets
	base    *client.HTTPTransport // for exchanges without a Base
	baseMu  sync.Mutex
}

func (rn *Runner) init() {
	rn.once.Do(func() {
		rn.budgets = rn.Budgets
		if rn.budgets == nil {
			rn.budgets = engine.NewBudgets()
		}
	})
}

// defaultBase is the transport of exchanges without a Base, made on first
// use.
func (rn *Runner) defaultBase() *client.HTTPTransport {
	rn.baseMu.Lock()
	defer rn.baseMu.Unlock()
	if rn.base == nil {
		rn.base = client.NewHTTPTransport(client.HTTPOptions{})
	}
	return rn.base
}

// Run runs x's attempts: each is sent on x.Base, its evidence gathered,
// and engine.Decide asked whether to retry, until it says stop. A response
// is returned only once the engine decided not to retry it.
func (rn *Runner) Run(x *Exchange) Result {
	rn.init()
	r := &x.run
	*r = run{rn: rn, req: x.Request, work: x.Request, ht: x.Base, order: x.FieldOrder, bulkhead: x.Bulkhead,
		eps: x.Endpoints, note: x.Note, start: rn.now()}
	if r.ht == nil {
		r.ht = rn.defaultBase()
	}
	r.pol = x.Policy
	return r.do()
}

func (rn *Runner) now() time.Time {
	if rn.Now != nil {
		return rn.Now()
	}
	return time.Now()
}

func (rn *Runner) rand() engine.Rand {
	if rn.Rand != nil {
		return rn.Rand
	}
	return engine.DefaultRand
}

func (rn *Runner) sleep(ctx context.Context, d time.Duration) error {
	if rn.Sleep != nil {
		return rn.Sleep(ctx, d)
	}
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Transport is an http.RoundTripper that runs a request's attempts on Base
// and retries only when engine.Decide allows it (spec decision.md): a
// Runner for Go programs, each request an Exchange made from its fields.
//
// Truthfulness against hidden retries: net/http's Transport replays a
// request by itself on a new connection when a pooled one turns out dead
// (nothing written; or, for GET/HEAD/OPTIONS/TRACE and requests carrying
// an Idempotency-Key, the server closed or reset it before answering),
// again and again while it finds pooled connections, outside the budget
// and max_attempts, and whatever the policy says of idempotency; and
// net/http's HTTP/2 pool replays refused streams and GOAWAYs by itself.
// The default Base, client.HTTPTransport, speaks HTTP/1.1 itself and runs HTTP/2
// on its own pool that calls ClientConn.RoundTrip directly, so neither
// happens there. For any other Base (a net/http Transport, say),
// Transport sends every attempt with GetBody unset (net/http cannot
// replay a body it cannot rewind) and gives a body-less request that
// net/http would replay an empty body it cannot rewind either (with
// Transfer-Encoding "identity", so the wire is unchanged). What remains
// there (a body-less POST, PUT or PATCH that net/http moves to another
// connection after writing nothing on the first) is counted in
// Attempt.HiddenRetries once something was written, and an attempt that
// moved never claims not_sent.
//
// Evidence: a client.HTTPTransport Base is handed each attempt (its bounds and
// its trace) with the request; any other Base is followed through
// net/http/httptrace hooks in the request's context.
//
// Responses: before a response is returned its first body chunk is read
// (bounded by the request's deadline, not by AttemptTimeout, which stops at
// the headers), so that a body that breaks before its first byte is still
// a retryable body_interrupted attempt. Once returned, a body error goes to
// the caller (no retry) and is recorded on the trace's last attempt. A
// response that is retried is kept, its body buffered up to KeepBody, and
// returned if the later attempts end without a response, unless a
// non-idempotent request was sent again after it (then the answer is
// ambiguous: the kept response no longer tells the truth).
//
// Errors: *AmbiguousError (errors.Is ErrAmbiguous) when a non-idempotent
// request may have run; otherwise *Error (ErrNotSent or ErrFailed). Both
// carry the attempts, the trace, the status a proxy answers, and unwrap to
// the last attempt's cause.
//
// The zero value is usable. Fields must not change once requests run.
type Transport struct {
	// Base runs one attempt. nil: client.NewHTTPTransport(client.HTTPOptions{}).
	Base http.RoundTripper
	// Policy gives the request's policy. nil: DefaultPolicy(host:port).
	Policy func(*http.Request) Policy
	// Budgets, Witness, Rand, Now, Sleep, KeepBody, Metrics: as Runner's.
	Budgets *engine.Budgets
	Witness witness.Witness
	Rand    engine.Rand
	// Draining reports that the runtime is shutting down (no new retries).
	Draining func() bool
	// Acquire, when set, takes a bulkhead permit for one attempt; release
	// is called when the attempt ends (for a returned response: when its
	// body is closed or read to the end). No permit is held while waiting
	// before a retry. An error is the attempt's pool_timeout.
	Acquire func(ctx context.Context, upstream string) (release func(), err error)
	// OnTrace is called once per request when it is finished: when RoundTrip
	// returns an error, or when the returned response's body is closed or
	// read to its end.
	OnTrace  func(*Trace)
	Now      func() time.Time
	Sleep    func(ctx context.Context, d time.Duration) error
	KeepBody int64
	Metrics  *Metrics

	once sync.Once
	rn   Runner
	ht   *client.HTTPTransport // Base, when it is one (attempts handed to it)
	base http.RoundTripper     // any other Base (attempts followed by httptrace)
}

var _ http.RoundTripper = (*Transport)(nil)

func (t *Transport) init() {
	t.once.Do(func() {
		t.rn = Runner{Budgets: t.Budgets, Witness: t.Witness, Rand: t.Rand, Now: t.Now,
			Sleep: t.Sleep, KeepBody: t.KeepBody, Metrics: t.Metrics}
		t.rn.init()
		switch b := t.Base.(type) {
		case nil:
			t.ht = client.NewHTTPTransport(client.HTTPOptions{})
		case *client.HTTPTransport:
			t.ht = b
		default:
			t.base = b
		}
	})
}

// CloseIdleConnections closes Base's idle connections.
func (t *Transport) CloseIdleConnections() {
	t.init()
	if t.ht != nil {
		t.ht.CloseIdleConnections()
	} else if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip runs the request's attempts (see Transport). It returns the last
// response, or an *AmbiguousError or *Error.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.init()
	r := &run{rn: &t.rn, req: req, work: req, ht: t.ht, base: t.base,
		draining: t.Draining, onTrace: t.OnTrace, bodyEnds: true, start: t.rn.now()}
	if t.Policy != nil {
		r.pol = t.Policy(req)
	} else {
		r.pol = DefaultPolicy("")
	}
	if t.Acquire != nil {
		r.bulkhead = &funcBulkhead{acquire: t.Acquire, upstream: r.pol.Upstream}
	}
	res := r.do()
	return res.Response, res.Err
}

// funcBulkhead is Transport.Acquire as a Bulkhead. The attempts of a run
// come one after another, so it holds one permit at most.
type funcBulkhead struct {
	acquire  func(ctx context.Context, upstream string) (func(), error)
	upstream string
	release  func()
}

func (b *funcBulkhead) Enter(ctx context.Context) error {
	release, err := b.acquire(ctx, b.upstream)
	b.release = release
	return err
}

func (b *funcBulkhead) Leave() {
	if b.release != nil {
		b.release()
		b.release = nil
	}
}

// fill completes a policy's gaps: the budget named by the URL's
// host:port, at least one attempt, the default backoff and budget.
func (p *Policy) fill(req *http.Request) {
	if p.Upstream == "" && req.URL != nil {
		p.Upstream = client.CanonicalAddr(req.URL)
	}
	if p.MaxAttempts < 1 {
		p.MaxAttempts = 1
	}
	if p.Backoff == (engine.Backoff{}) {
		p.Backoff = engine.DefaultBackoff
	}
	if p.Budget == (engine.BudgetConfig{}) {
		p.Budget = engine.DefaultBudget
	}
}

// BodyKind returns the replayability of the request's body: none without a
// body; what a body implementing BodyKind() engine.Body says of itself
// (if it says replayable or reopenable, GetBody must be set to reopen it);
// replayable with GetBody; else one_shot.
func BodyKind(req *http.Request) engine.Body {
	if req.Body == nil || req.Body == http.NoBody {
		return engine.BodyNone
	}
	k := engine.BodyOneShot
	if req.GetBody != nil {
		k = engine.BodyReplayable
	}
	if bk, ok := req.Body.(interface{ BodyKind() engine.Body }); ok {
		k = bk.BodyKind()
		if k.Replayable() && k != engine.BodyNone && req.GetBody == nil {
			k = engine.BodyOneShot
		}
	}
	return k
}

// run is one request going through its attempts. It reads top to bottom:
// do runs the attempts (attempt: dispatch and evidence; decide: the
// engine and the budget) and ends in end, the one way a run ends: with a
// response, whose body's end completes the run (finish: Result.Finish,
// or for a Transport the body's own end), or with an error, which
// completes it at once.
type run struct {
	rn        *Runner
	req, work *http.Request
	pol       Policy
	// ht runs the attempts, handed each one explicitly; base (when ht is
	// nil) is another transport, followed through httptrace.
	ht       *client.HTTPTransport
	base     http.RoundTripper
	order    []string // header field order (Exchange.FieldOrder)
	bulkhead Bulkhead
	eps      Endpoints    // Exchange.Endpoints
	note     string       // Exchange.Note
	draining func() bool  // Transport.Draining
	onTrace  func(*Trace) // Transport.OnTrace
	// bodyEnds: the response body's end (EOF, an error, Close) finishes
	// the run (Transport: a Go program calls no Finish).
	bodyEnds bool
	finished sync.Once

	start      time.Time
	idempotent bool
	kind       engine.Body
	// parent is the caller's context; deadline the request's overall
	// deadline (zero: none), the sooner of the policy's and parent's.
	parent   context.Context
	deadline time.Time
	// ctx is parent bounded by deadline, made on demand (context): only a
	// retry's wait and a credential refresh need one; attempts have their
	// own (attempt.Ctx).
	ctx    context.Context
	cancel context.CancelFunc
	ledger engine.Ledger
	budget *engine.Budget

	// kept is the last response of a retried status, buffered; keptAfter
	// says a later attempt got past not_sent without a response.
	kept      *http.Response
	keptAfter bool

	// In the run's allocation: its trace, the first attempt's record and
	// state, and the body of the response it returns.
	trace    Trace
	attempts [1]Attempt
	first    attemptResult
	body     responseBody
}

// attemptResult is how one attempt ended.
type attemptResult struct {
	resp    *http.Response // headers arrived and the body did not break before its first byte
	peek    []byte         // the body's first chunk
	peekErr error          // the error that came with it
	peekBuf *[]byte        // pooled buffer behind peek
	err     error          // the failure, when resp is nil
	permit  bool           // a bulkhead permit is held
	ctx     attempt.Ctx
	at      attempt.Trace
	req     http.Request // the attempt's request, in this allocation
	url     url.URL      // its URL when an endpoint was picked (Exchange.Endpoints)
	picked  bool         // Endpoints.Pick chose this attempt's endpoint
}

func (r *run) do() Result {
	req := r.req
	r.pol.fill(req)
	method := req.Method
	if method == "" {
		method = http.MethodGet // net/http's reading of an empty method
	}
	r.idempotent = r.pol.Idempotency.Resolve(method, req.Header.Get(engine.IdempotencyKeyHeader) != "")
	r.kind = BodyKind(req)
	r.parent = req.Context()
	// Deadlines run on the real clock whatever Now says.
	r.deadline, _ = r.parent.Deadline()
	if r.pol.Timeout > 0 {
		if dl := time.Now().Add(r.pol.Timeout); r.deadline.IsZero() || dl.Before(r.deadline) {
			r.deadline = dl
		}
	}
	r.trace = Trace{
		RequestID:  req.Header.Get(HeaderRequestID),
		Method:     method,
		Upstream:   r.pol.Upstream,
		Idempotent: r.idempotent,
		Body:       r.kind,
		Start:      r.start,
		Attempts:   r.attempts[:0],
		Note:       r.note,
	}
	if req.URL != nil {
		r.trace.URL = req.URL.String()
	}
	if err := validate(req); err != nil {
		return r.invalid(err)
	}
	now := r.rn.now()
	r.budget = r.rn.budgets.Get(r.pol.Upstream, r.pol.Budget, now)
	r.budget.Earn(now)

	body := req.Body
	for n := 1; ; n++ {
		// The attempt is recorded in place in the trace (an Attempt is
		// large: copies of it would deepen every request's stack).
		r.trace.Attempts = append(r.trace.Attempts, Attempt{N: n})
		rec := &r.trace.Attempts[len(r.trace.Attempts)-1]
		ar := &r.first
		if n > 1 {
			ar = &attemptResult{}
		}
		r.attempt(ar, rec, body)
		if ar.picked {
			r.eps.Done(rec.Failure != engine.CategoryNone || rec.Status >= 500)
		}
		res := r.decide(rec, ar)
		r.rn.Metrics.attempt(rec)
		if ar.resp == nil && rec.Evidence != engine.NotSent {
			r.keptAfter = true
		}
		if res.Decision != engine.Retry {
			return r.end(ar, ar.err)
		}
		// Retry: nothing of this attempt is held while waiting.
		if ar.resp != nil {
			r.keep(ar)
		}
		r.done(ar)
		if rec.Failure == engine.CategoryNone && rec.Status == http.StatusUnauthorized {
			if err := r.refresh(); err != nil {
				return r.end(nil, err)
			}
		}
		if err := r.rn.sleep(r.context(), res.Wait); err != nil {
			return r.end(nil, err)
		}
		body = nil
		if r.kind != engine.BodyNone {
			b, err := r.work.GetBody()
			if err != nil {
				return r.end(nil, fmt.Errorf("%w: %w", ErrRequestInvalid, err))
			}
			body = b
		}
	}
}

// invalid ends a request no attempt could send (a function of its own:
// the request's path keeps a small stack frame).
//
//go:noinline
func (r *run) invalid(err error) Result {
	if r.req.Body != nil {
		r.req.Body.Close()
	}
	r.trace.Attempts = append(r.trace.Attempts, Attempt{N: 1, Start: r.start, Stage: StagePool,
		Failure: engine.RequestInvalid, Evidence: engine.NotSent, Err: err.Error(),
		Decision: engine.Result{Reason: engine.ReasonPermanentFailure}})
	r.ledger.Record(engine.NotSent, engine.RequestInvalid, 0, r.trace.Attempts[0].Decision)
	return r.end(nil, fmt.Errorf("%w: %w", ErrRequestInvalid, err))
}

// validate refuses what no attempt could send.
func validate(req *http.Request) error {
	switch {
	case req.URL == nil:
		return errors.New("request without URL")
	case req.URL.Scheme != "http" && req.URL.Scheme != "https":
		return errors.New("unsupported scheme " + strconv.Quote(req.URL.Scheme))
	case req.URL.Host == "":
		return errors.New("request without host")
	}
	return nil
}

// refresh runs the credential refresher once, on a private copy of the
// request so that the caller's headers are never touched.
func (r *run) refresh() error {
	if r.pol.Refresh == nil {
		return errors.New("no credential refresher")
	}
	if r.work == r.req {
		r.work = r.req.Clone(r.req.Context())
	}
	r.ledger.Refreshed = true
	return r.pol.Refresh(r.context(), r.work)
}

// context returns the request's context bounded by its overall deadline.
func (r *run) context() context.Context {
	if r.ctx == nil {
		if r.deadline.IsZero() {
			r.ctx = r.parent
		} else {
			r.ctx, r.cancel = context.WithDeadline(r.parent, r.deadline)
		}
	}
	return r.ctx
}

// over reports whether the caller gave up or the overall deadline passed.
func (r *run) over() error {
	if err := r.parent.Err(); err != nil {
		return err
	}
	if !r.deadline.IsZero() && !time.Now().Before(r.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// netHTTPReplays reports whether net/http would replay this body-less
// request on its own after a dead pooled connection.
func netHTTPReplays(req *http.Request) bool {
	switch req.Method {
	case "", "GET", "HEAD", "OPTIONS", "TRACE":
		return true
	}
	return req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
}

// attempt runs one attempt into ar and classifies how it ended in rec.
// client.HTTPTransport is handed the attempt itself (its bounds, its evidence)
// and the field order; any other base is followed through httptrace.
func (r *run) attempt(ar *attemptResult, rec *Attempt, body io.ReadCloser) {
	rn := r.rn
	rec.Start = rn.now()
	at := &ar.at
	at.Witness = rn.Witness
	at.Risky = !r.idempotent
	ar.ctx.Start(r.parent, at, r.deadline, r.pol.AttemptTimeout)
	var actx context.Context = &ar.ctx
	if r.ht == nil {
		actx = httptrace.WithClientTrace(actx, at.ClientTrace())
	}
	defer func() { rec.Duration = rn.now().Sub(rec.Start) }()

	if r.bulkhead != nil {
		if err := r.bulkhead.Enter(actx); err != nil {
			if body != nil {
				body.Close()
			}
			ar.err = err
			rec.Stage, rec.Failure, rec.Evidence, rec.Err = StagePool, engine.PoolTimeout, engine.NotSent, err.Error()
			return
		}
		ar.permit = true
	}

	var addr string
	if r.eps != nil {
		var ok bool
		if addr, ok = r.eps.Pick(); !ok {
			if body != nil {
				body.Close()
			}
			ar.err = ErrNoEndpoint
			rec.Stage, rec.Failure, rec.Evidence, rec.Err = StageDNS, engine.DNSNotFound, engine.NotSent, ErrNoEndpoint.Error()
			return
		}
		ar.picked = true
		rec.Endpoint = addr
	}

	ar.req = *r.work.WithContext(actx) // WithContext's copy stays on the stack
	areq := &ar.req
	if addr != "" {
		// The endpoint is dialled; the Host header still names the
		// upstream the client addressed.
		ar.url = *areq.URL
		if areq.Host == "" {
			areq.Host = ar.url.Host
		}
		ar.url.Host = addr
		areq.URL = &ar.url
	}
	areq.GetBody = nil
	areq.Body = body
	if r.kind == engine.BodyNone {
		areq.Body, areq.ContentLength = nil, 0
		if r.ht == nil && netHTTPReplays(areq) {
			// net/http would replay it on its own after a dead pooled
			// connection, as often as it finds one, outside the budget
			// and max_attempts: an empty body it cannot rewind stops
			// that; "identity" keeps the wire as it was (no chunked
			// framing, no probe of the body).
			client.MarkEmptyBody(areq)
		}
	}
	var resp *http.Response
	var err error
	if r.ht != nil {
		resp, err = r.ht.Send(areq, &ar.ctx, r.order)
	} else {
		resp, err = r.base.RoundTrip(areq)
	}
	// From here on only the overall deadline bounds the attempt (its body).
	fired := ar.ctx.HeadArrived()
	if err == nil && fired {
		// The head came as the timer ended the attempt: too late.
		resp.Body.Close()
		resp, err = nil, ar.ctx.Cause()
		if err == nil {
			// The timer has marked the attempt timed out but is still
			// freezing the connection: it has not ended it yet.
			err = attempt.ErrTimeout
		}
	}
	pr := at.Progress()
	rec.HiddenRetries = pr.Hidden
	rec.Reused, rec.Idle, rec.IdleBound = pr.Reused, pr.Idle, pr.Bound
	if err != nil {
		// fired is final: once the head phase ended, the timer can no
		// longer end the attempt as a timeout.
		timedOut := fired || errors.Is(r.over(), context.DeadlineExceeded)
		ar.err = err
		rec.Err = err.Error()
		rec.Failure, rec.Stage = classify(&pr, err, timedOut)
		rec.Evidence = rec.Failure.Evidence()
		r.witness(at, rec)
		return
	}
	rec.Status = resp.StatusCode
	rec.Stage = StageComplete
	rec.Evidence = engine.ResponseReceived
	if needPeek(areq, resp) {
		bp := peekPool.Get().(*[]byte)
		buf := *bp
		var k int
		var perr error
		for range 8 {
			k, perr = resp.Body.Read(buf)
			if k > 0 || perr != nil {
				break
			}
		}
		if k == 0 && perr != nil && perr != io.EOF {
			// The body broke before its first byte: nothing was delivered,
			// so this is an attempt failure like any other.
			peekPool.Put(bp)
			resp.Body.Close()
			ar.err = perr
			rec.Err = perr.Error()
			rec.Stage, rec.Failure, rec.Evidence = StageBody, engine.BodyInterrupted, engine.PartialResponse
			return
		}
		ar.peek, ar.peekErr, ar.peekBuf = buf[:k], perr, bp
	}
	ar.resp = resp
}

// witness lets the kernel witness upgrade sent_no_response to not_sent.
func (r *run) witness(at *attempt.Trace, rec *Attempt) {
	if r.rn.Witness == nil || rec.Evidence != engine.SentNoResponse {
		return
	}
	pr := at.Progress()
	before, hasBefore, movedAfterWrite, ended := pr.Before, pr.HasBefore, pr.Hidden > 0, pr.EndBeforeAnswer
	if !hasBefore || movedAfterWrite {
		return
	}
	after, ok := at.After()
	rec.WitnessBefore = before
	if !ok {
		return
	}
	rec.WitnessAfter = after
	switch {
	case witness.NoByteLeft(before, after):
		rec.Evidence, rec.Upgraded, rec.Proof = engine.NotSent, true, ProofNoByteLeft
	case ended && witness.EndedBeforeAck(before, after):
		// Bytes left, but the upstream had closed before the first of
		// them reached it (its FIN acked none; it reset them).
		rec.Evidence, rec.Upgraded, rec.Proof = engine.NotSent, true, ProofEndedBeforeAck
	}
}

// peekPool holds the buffers the first body chunk is read into.
var peekPool = sync.Pool{New: func() any { b := make([]byte, 4096); return &b }}

// putPeek returns a peek buffer to the pool.
func putPeek(bp **[]byte) {
	if *bp != nil {
		peekPool.Put(*bp)
		*bp = nil
	}
}

// needPeek says whether the response may have a body to peek at.
func needPeek(req *http.Request, resp *http.Response) bool {
	if req.Method == http.MethodHead || resp.Body == nil || resp.Body == http.NoBody || resp.ContentLength == 0 {
		return false
	}
	s := resp.StatusCode
	return s >= 200 && s != http.StatusNoContent && s != http.StatusNotModified
}

// leave gives back the attempt's bulkhead permit, if it holds one.
func (ar *attemptResult) leave(b Bulkhead) {
	if ar.permit {
		ar.permit = false
		b.Leave()
	}
}

// done releases what the attempt holds (its permit and context).
func (r *run) done(ar *attemptResult) {
	ar.peek = nil
	putPeek(&ar.peekBuf)
	if ar.resp != nil {
		ar.resp.Body.Close()
		ar.resp = nil
	}
	ar.leave(r.bulkhead)
	ar.ctx.Finish()
}

// decide asks the engine about the attempt rec and records the answer.
func (r *run) decide(rec *Attempt, ar *attemptResult) engine.Result {
	now := r.rn.now()
	in := engine.Input{
		Attempt:           rec.N,
		MaxAttempts:       r.pol.MaxAttempts,
		Body:              r.kind,
		Draining:          r.isDraining(),
		MinAttempt:        r.pol.MinAttempt,
		Failure:           rec.Failure,
		Evidence:          rec.Evidence,
		Idempotent:        r.idempotent,
		TransientStatuses: r.pol.TransientStatuses,
		CanRefresh:        r.pol.Refresh != nil,
		Refreshed:         r.ledger.Refreshed,
		Backoff:           r.pol.Backoff,
		PrevWait:          r.ledger.PrevWait,
	}
	if !r.deadline.IsZero() {
		in.HasDeadline, in.DeadlineRemaining = true, time.Until(r.deadline)
	}
	status := rec.Status
	if ar.resp != nil {
		in.Status = status
		if s, wait, hasWait, ok := grpcRule(ar.resp); ok && r.idempotent {
			in.Status, in.RetryAfter, in.HasRetryAfter = s, wait, hasWait
			rec.RuleStatus, status = s, s
		} else if s := rec.Status; s == http.StatusTooManyRequests || s == http.StatusServiceUnavailable {
			in.RetryAfter, in.HasRetryAfter = parseRetryAfter(ar.resp.Header.Get("Retry-After"), now)
		}
	}
	// A success is never retried and consults nothing: spare the budget's
	// lock on the hot path.
	if ar.resp == nil || status >= 400 {
		in.BudgetTokens = r.budget.Tokens(now)
	}
	res := engine.Decide(&in, r.rn.rand())
	if res.Decision == engine.Retry {
		switch {
		case r.over() != nil:
			// The caller gave up (a deadline would have been caught by
			// rule 6).
			res = engine.Result{Decision: engine.Deny, Reason: engine.ReasonDeadline}
		case !r.budget.Spend(now):
			res = engine.Result{Decision: engine.Deny, Reason: engine.ReasonBudgetExhausted}
		}
	}
	rec.Budget, rec.BudgetRead = in.BudgetTokens, ar.resp == nil || status >= 400
	rec.Decision = res
	r.ledger.Record(rec.Evidence, rec.Failure, status, res)
	return res
}

// parseRetryAfter reads delay-seconds or an HTTP-date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0, false
		}
		if s > 1<<31 {
			s = 1 << 31
		}
		return time.Duration(s) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(0, at.Sub(now)), true
	}
	return 0, false
}

// keep buffers a retried response's body so that it can be returned if the
// later attempts fail without a response.
func (r *run) keep(ar *attemptResult) {
	limit := r.rn.KeepBody
	if limit == 0 {
		limit = DefaultKeepBody
	}
	resp := ar.resp
	r.kept, r.keptAfter = nil, false
	if limit < 0 || resp.ContentLength > limit {
		return
	}
	buf := append([]byte(nil), ar.peek...)
	if ar.peekErr == nil {
		rest, err := io.ReadAll(io.LimitReader(resp.Body, limit-int64(len(buf))+1))
		if err != nil || int64(len(buf)+len(rest)) > limit {
			return
		}
		buf = append(buf, rest...)
	} else if ar.peekErr != io.EOF {
		return
	}
	kept := *resp
	kept.Body = io.NopCloser(bytes.NewReader(buf))
	kept.ContentLength = int64(len(buf))
	r.kept = &kept
}

// isDraining reports whether the runtime is shutting down.
func (r *run) isDraining() bool {
	if d := r.rn.Draining; d != nil && d.Load() {
		return true
	}
	return r.draining != nil && r.draining()
}

// end is how every run ends, after the engine's last decision or when
// the run cannot go on (the caller gave up, a refresh or GetBody failed,
// the request was invalid): ar is the last attempt (nil when it is
// already released), cause why no response came.
//
// The last attempt's response is returned, marked when its status is
// ambiguous. Without one, a response kept from an earlier attempt is the
// last response, unless a non-idempotent request was sent again after it:
// then that response no longer tells the truth. A kept response was
// retried, so it is never an ambiguous status. Otherwise the run ends
// with its outcome as an error.
//
// A returned response's run is completed by Result.Finish (a Transport's
// by the body's end); an error completes it here.
func (r *run) end(ar *attemptResult, cause error) Result {
	if ar != nil && ar.resp != nil {
		resp := ar.resp
		ar.resp = nil
		r.respond(resp, ar, r.ledger.AmbiguousStatus)
		return Result{Response: resp, Trace: &r.trace, run: r}
	}
	if ar != nil {
		r.done(ar)
	}
	if r.kept != nil && (r.idempotent || !r.keptAfter) {
		resp := r.kept
		r.respond(resp, nil, false)
		return Result{Response: resp, Trace: &r.trace, run: r}
	}
	o := r.ledger.Outcome(r.idempotent, false)
	r.trace.Outcome = o
	status := r.ledger.Status(o)
	n := len(r.trace.Attempts)
	var err error
	if o == engine.OutcomeAmbiguous {
		err = &AmbiguousError{Status: status, Attempts: n, Trace: &r.trace, Err: cause}
	} else {
		err = &Error{Outcome: o, Status: status, Attempts: n, Trace: &r.trace, Err: cause}
	}
	r.finish(nil)
	return Result{Err: err, Trace: &r.trace}
}

// respond gives resp the run's body; ar is the attempt it came from (nil:
// a kept response), whose peeked first chunk the body owns from now on
// and which the run's finish releases.
func (r *run) respond(resp *http.Response, ar *attemptResult, ambiguous bool) {
	if ambiguous {
		r.trace.Outcome = engine.OutcomeAmbiguous
		resp.Header = resp.Header.Clone()
		if resp.Header == nil {
			resp.Header = make(http.Header)
		}
		resp.Header.Set(HeaderOutcome, engine.OutcomeAmbiguous.String())
	}
	b := &r.body
	*b = responseBody{rc: resp.Body, r: r, ar: ar}
	if ar != nil {
		b.peek, b.peekErr, b.peekBuf = ar.peek, ar.peekErr, ar.peekBuf
		ar.peek, ar.peekBuf = nil, nil
	}
	resp.Body = b
	if rw, ok := b.rc.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		// An upgraded connection (WebSocket): no longer HTTP, and no
		// longer the run's. The run ends with the switch (its attempt's
		// bulkhead permit and context given back, its outcome counted),
		// not when the connection ends, which may be hours later; the
		// body is the connection, writable, its bytes no attempt's.
		resp.Body = &upgradedBody{ReadWriteCloser: rw, trace: &r.trace}
		r.finish(nil)
	}
}

// finish completes the run once, whoever calls it first (Result.Finish,
// end for an error, respond for a switch, a Transport's body at its end):
// a body that broke (bodyErr other than io.EOF) is recorded on the last
// attempt, the attempt the response came from is released (its bulkhead
// permit and context), and the run completed. It returns the final trace.
func (r *run) finish(bodyErr error) *Trace {
	r.finished.Do(func() {
		if bodyErr != nil && bodyErr != io.EOF && len(r.trace.Attempts) > 0 {
			// The body broke after the response was returned: the caller
			// got the error, nothing is retried.
			a := &r.trace.Attempts[len(r.trace.Attempts)-1]
			a.Stage, a.Failure, a.Evidence, a.Err = StageBody, engine.BodyInterrupted, engine.PartialResponse, bodyErr.Error()
		}
		if ar := r.body.ar; ar != nil {
			ar.leave(r.bulkhead)
			ar.ctx.Finish()
		}
		r.complete()
	})
	return &r.trace
}

// complete finishes the run: its context is released, its outcome
// counted and, for a Transport, its trace handed to OnTrace.
func (r *run) complete() {
	if r.cancel != nil {
		r.cancel()
	}
	if r.trace.Outcome == engine.OutcomeNone {
		r.rn.Metrics.outcome("response")
	} else {
		r.rn.Metrics.outcome(r.trace.Outcome.String())
	}
	if r.onTrace != nil {
		r.onTrace(&r.trace)
	}
}

// upgradedBody is the body of a 101 response: the connection itself,
// whose run is complete.
type upgradedBody struct {
	io.ReadWriteCloser
	trace *Trace
}

// CloseWrite half-closes the connection's sending side, where it can.
func (u *upgradedBody) CloseWrite() error {
	if cw, ok := u.ReadWriteCloser.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// SetReadDeadline sets the connection's read deadline, where it can.
func (u *upgradedBody) SetReadDeadline(t time.Time) error {
	if d, ok := u.ReadWriteCloser.(interface{ SetReadDeadline(time.Time) error }); ok {
		return d.SetReadDeadline(t)
	}
	return errors.ErrUnsupported
}

// responseBody is the body of a returned response. For a Transport its
// end (EOF, an error, Close) finishes the run; for a Runner the caller's
// Result.Finish does.
type responseBody struct {
	rc      io.ReadCloser
	peek    []byte
	peekBuf *[]byte
	peekErr error
	r       *run
	ar      *attemptResult
}

func (b *responseBody) Read(p []byte) (int, error) {
	if len(b.peek) > 0 {
		n := copy(p, b.peek)
		b.peek = b.peek[n:]
		if len(b.peek) == 0 {
			b.peek = nil
			putPeek(&b.peekBuf)
		}
		return n, nil
	}
	var n int
	var err error
	if b.peekErr != nil {
		err = b.peekErr
	} else {
		n, err = b.rc.Read(p)
	}
	if err != nil && b.r.bodyEnds {
		b.r.finish(err)
	}
	return n, err
}

// Close may run while another goroutine reads (to abort it), so it leaves
// the peeked chunk alone; its buffer is then left to the collector.
func (b *responseBody) Close() error {
	err := b.rc.Close()
	if b.r.bodyEnds {
		b.r.finish(nil)
	}
	return err
}

// TraceOf returns the trace of a response returned by Transport.RoundTrip,
// e.g. for a proxy to tell the number of attempts before relaying it. Read
// it only from the goroutine that reads the body.
func TraceOf(resp *http.Response) (*Trace, bool) {
	if resp == nil {
		return nil, false
	}
	switch b := resp.Body.(type) {
	case *responseBody:
		return &b.r.trace, true
	case *upgradedBody:
		return b.trace, true
	}
	return nil, false
}
