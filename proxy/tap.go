package proxy

import (
	"net/url"
	"sync"
	"time"
)

// Event is one finished request as `egret observe` shows it: who sent it,
// where it went, what egret did and what the client was told.
type Event struct {
	Time      time.Time `json:"time"` // when the answer was given
	RequestID string    `json:"request_id"`
	Namespace string    `json:"namespace"` // "" for egret proxy
	Pod       string    `json:"pod"`       // "" for egret proxy
	Workload  string    `json:"workload"`  // "deployment/web"; "" when unknown
	Method    string    `json:"method"`
	URL       string    `json:"url"` // as log lines show it (LogQuery)
	Upstream  string    `json:"upstream"`
	// Outcome: relayed, ambiguous, not-sent, failed, rejected, tunnel,
	// upgrade or forward_proxy.
	Outcome  string `json:"outcome"`
	Attempts int    `json:"attempts"`
	// Reason is the last retry decision's reason ("none" without one).
	Reason string `json:"reason"`
	Status int    `json:"status"` // 0: no status was answered
	// Duration is from the request's head to its answer, in seconds.
	Duration float64 `json:"duration_seconds"`
	Error    string  `json:"error"`
}

// Outcomes are the values of Event.Outcome.
var Outcomes = []string{labelRelayed, "ambiguous", "not-sent", "failed", labelRejected, "tunnel", "upgrade", "forward_proxy"}

// Filter selects events; an empty field matches any value. Pod matches
// the pod's name, or namespace/name.
type Filter struct {
	Namespace, Pod, Upstream, Outcome string
}

// Match reports whether e passes f.
func (f Filter) Match(e *Event) bool {
	return (f.Namespace == "" || f.Namespace == e.Namespace) &&
		(f.Pod == "" || f.Pod == e.Pod || e.Namespace != "" && f.Pod == e.Namespace+"/"+e.Pod) &&
		(f.Upstream == "" || f.Upstream == e.Upstream) &&
		(f.Outcome == "" || f.Outcome == e.Outcome)
}

// DefaultTapRecent is how many events a Tap keeps for Observe's last.
const DefaultTapRecent = 1024

// DefaultObserverQueue is an Observer's queue: the events it may fall
// behind by before it misses some.
const DefaultObserverQueue = 1024

// Tap hands every finished request of the servers that share it to its
// observers (`egret observe`), and keeps the most recent ones. The request
// path never waits for an observer: each has a bounded queue, and an event
// that finds it full is dropped and counted (Observer.Dropped). Safe for
// concurrent use; one per node, given to every pod's Server.
type Tap struct {
	mu        sync.Mutex
	ring      []tapRecord
	next      int
	observers []*Observer
}

// tapRecord is an event as the request path leaves it: the URL is
// rendered only when an event is read.
type tapRecord struct {
	e        Event
	u        *url.URL
	logQuery bool
}

func (r *tapRecord) event() Event {
	e := r.e
	if e.URL == "" && r.u != nil {
		e.URL = logURL(r.u, r.logQuery)
	}
	return e
}

// NewTap returns a tap that keeps the last recent events
// (DefaultTapRecent if recent <= 0).
func NewTap(recent int) *Tap {
	if recent <= 0 {
		recent = DefaultTapRecent
	}
	return &Tap{ring: make([]tapRecord, 0, recent)}
}

// Observer receives a Tap's events that pass its filter (Observe).
type Observer struct {
	t       *Tap
	f       Filter
	ch      chan Event
	dropped uint64 // under t.mu
	closed  bool
}

// C delivers the events; it is closed by Close.
func (o *Observer) C() <-chan Event { return o.ch }

// Dropped is how many events passed the filter but found the queue full.
func (o *Observer) Dropped() uint64 {
	o.t.mu.Lock()
	defer o.t.mu.Unlock()
	return o.dropped
}

// Close stops the observer and closes C.
func (o *Observer) Close() {
	t := o.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if o.closed {
		return
	}
	o.closed = true
	for i, x := range t.observers {
		if x == o {
			t.observers = append(t.observers[:i], t.observers[i+1:]...)
			break
		}
	}
	close(o.ch)
}

// Recent returns up to n of the kept events that pass f, oldest first.
func (t *Tap) Recent(f Filter, n int) []Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.recent(f, n)
}

func (t *Tap) recent(f Filter, n int) []Event {
	if n <= 0 {
		return nil
	}
	var out []Event
	// Newest first, then reversed.
	for k := 0; k < len(t.ring) && len(out) < n; k++ {
		// Until the ring is full next is 0 and the newest is last.
		i := (t.next - 1 - k + 2*len(t.ring)) % len(t.ring)
		if !f.Match(&t.ring[i].e) {
			continue
		}
		out = append(out, t.ring[i].event())
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// Observe returns the last kept events that pass f (up to last, oldest
// first) and, when follow, an observer of those to come, with a queue
// of queue events (DefaultObserverQueue if <= 0): none is missed or
// repeated between the two.
func (t *Tap) Observe(f Filter, last int, follow bool, queue int) ([]Event, *Observer) {
	if queue <= 0 {
		queue = DefaultObserverQueue
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	past := t.recent(f, last)
	if !follow {
		return past, nil
	}
	o := &Observer{t: t, f: f, ch: make(chan Event, queue)}
	t.observers = append(t.observers, o)
	return past, o
}

// publish records a finished request. It never blocks on an observer.
func (t *Tap) publish(r tapRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ring) < cap(t.ring) {
		t.ring = append(t.ring, r)
	} else {
		t.ring[t.next] = r
		t.next = (t.next + 1) % len(t.ring)
	}
	if len(t.observers) == 0 {
		return
	}
	e := r.event()
	for _, o := range t.observers {
		if !o.f.Match(&e) {
			continue
		}
		select {
		case o.ch <- e:
		default:
			o.dropped++
		}
	}
}

// Tap is the server's tap (Config.Tap).
func (s *Server) Tap() *Tap { return s.cfg.Tap }

// tap gives l, a finished request, to the server's tap.
func (c *conn) tap(l *requestLog, now time.Time) {
	t := c.s.cfg.Tap
	if t == nil {
		return
	}
	src := c.s.cfg.Source
	reason := l.reason
	if reason == "" {
		reason = reasonNone
	}
	errText := l.err
	if errText == "" && l.e != nil {
		errText = l.e.Error()
	}
	t.publish(tapRecord{e: Event{
		Time: now, RequestID: l.id, Namespace: src.Namespace, Pod: src.Pod, Workload: src.Workload,
		Method: l.method, URL: l.url, Upstream: l.upstream, Outcome: l.outcome, Attempts: l.attempts,
		Reason: reason, Status: l.status, Duration: now.Sub(l.start).Seconds(), Error: errText,
	}, u: l.u, logQuery: c.s.cfg.LogQuery})
}
