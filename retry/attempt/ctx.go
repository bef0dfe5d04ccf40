package attempt

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrTimeout is the cause of an attempt's context when its per-attempt
// timeout fired.
var ErrTimeout = errors.New("attempt timeout")

// Ctx is the context of one attempt. It does in one value, without
// allocations of its own, what three contexts and two timers did: it
// ends when the caller's context
// ends, when the per-attempt timeout passes before the response head has
// come (cause ErrTimeout), and when the request's overall deadline
// passes (cause context.DeadlineExceeded). One timer serves both bounds:
// it is armed for the sooner of the two and, once the head is in, re-armed
// for the deadline alone (the body is bounded by the deadline only).
//
// The runner hands it, with its trace (Trace), to the client explicitly
// (client.HTTPTransport.Send): the HTTP/1.1 client registers its
// connection's interrupt with SetHook rather than context.AfterFunc, and
// reports the attempt's progress to its Trace. Other code sees an ordinary context: Done
// makes its channel on demand, and context.AfterFunc and children of it
// use its AfterFunc method (no goroutine per child).
//
// Do not call context.Cause on it: it would report an ancestor's cause.
// The Cause method knows it.
type Ctx struct {
	parent context.Context
	at     *Trace
	// deadline is the request's overall deadline (the sooner of its policy
	// timeout and the caller's), zero when it has none.
	deadline time.Time

	mu       sync.Mutex
	err      error // non-nil once ended
	cause    error
	byTimer  bool // ended by its timer while the head was awaited
	headDone bool // the response head came: the timer bounds the deadline only
	done     chan struct{}
	timer    *time.Timer
	// timerCause is what the armed timer ends the attempt with.
	timerCause error
	hook       func() // the exchange's interrupt, nil when none is set
	funcs      []*ctxFunc
	stopParent func() bool
}

// ctxFunc is one function registered with AfterFunc.
type ctxFunc struct{ f func() }

var (
	_ context.Context = (*Ctx)(nil)
	_ interface {
		AfterFunc(func()) func() bool
	} = (*Ctx)(nil)
)

// closedChan is the Done channel of a context that ended before any asked.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Start arms the attempt's bounds: attemptTimeout (0: none) from now, the
// overall deadline and the parent's end.
func (a *Ctx) Start(parent context.Context, at *Trace, deadline time.Time, attemptTimeout time.Duration) {
	a.parent, a.at, a.deadline = parent, at, deadline
	var d time.Duration
	cause := error(nil)
	if attemptTimeout > 0 {
		d, cause = attemptTimeout, ErrTimeout
	}
	if !deadline.IsZero() {
		if left := time.Until(deadline); cause == nil || left <= d {
			d, cause = left, context.DeadlineExceeded
		}
	}
	if cause != nil {
		// Under the lock: a timer already due may fire at once, and fire
		// and end read a.timer under it.
		a.mu.Lock()
		a.timerCause = cause
		a.timer = time.AfterFunc(max(d, 0), a.fire)
		a.mu.Unlock()
	}
	if parent.Done() != nil {
		stop := context.AfterFunc(parent, a.parentEnded)
		a.mu.Lock()
		if a.err == nil {
			a.stopParent = stop
			a.mu.Unlock()
		} else {
			a.mu.Unlock()
			stop()
		}
	}
}

// Trace is the attempt's trace, the one Start was given.
func (a *Ctx) Trace() *Trace { return a.at }

func (a *Ctx) Deadline() (time.Time, bool) { return a.deadline, !a.deadline.IsZero() }

func (a *Ctx) Done() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done == nil {
		if a.err != nil {
			a.done = closedChan
		} else {
			a.done = make(chan struct{})
		}
	}
	return a.done
}

func (a *Ctx) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

func (a *Ctx) Value(key any) any { return a.parent.Value(key) }

// Cause is the reason the attempt ended: ErrTimeout, the deadline,
// the parent's cause; nil while it runs.
func (a *Ctx) Cause() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cause
}

// AfterFunc runs f in its own goroutine once the attempt ends (as
// context.AfterFunc does); stop unregisters it, reporting whether it did
// so before f was started.
func (a *Ctx) AfterFunc(f func()) func() bool {
	cf := &ctxFunc{f: f}
	a.mu.Lock()
	if a.err != nil {
		a.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	a.funcs = append(a.funcs, cf)
	a.mu.Unlock()
	return func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for i, x := range a.funcs {
			if x == cf {
				a.funcs = append(a.funcs[:i], a.funcs[i+1:]...)
				return true
			}
		}
		return false
	}
}

// SetHook registers the exchange's interrupt, run (synchronously) when the
// attempt ends; it runs at once when it has already ended.
func (a *Ctx) SetHook(f func()) {
	a.mu.Lock()
	if a.err != nil {
		a.mu.Unlock()
		f()
		return
	}
	a.hook = f
	a.mu.Unlock()
}

// ClearHook unregisters the interrupt, reporting whether the attempt was
// still running (false: the interrupt ran or is running).
func (a *Ctx) ClearHook() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hook = nil
	return a.err == nil && !a.byTimer
}

// HeadArrived ends the per-attempt timeout: the response head is in. It
// reports whether the timer had already ended the attempt (the response
// came too late); otherwise the timer bounds the overall deadline alone.
func (a *Ctx) HeadArrived() (late bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.byTimer {
		return true
	}
	a.headDone = true
	if a.timer == nil || a.err != nil || a.timerCause != ErrTimeout {
		return false
	}
	if a.deadline.IsZero() {
		a.timer.Stop()
		a.timer = nil
		return false
	}
	a.timerCause = context.DeadlineExceeded
	a.timer.Reset(max(time.Until(a.deadline), 0))
	return false
}

// TimedOut reports whether the attempt's timer ended it while the head
// was awaited (its per-attempt timeout, or the overall deadline).
func (a *Ctx) TimedOut() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.byTimer
}

func (a *Ctx) fire() {
	a.mu.Lock()
	if a.err != nil {
		a.mu.Unlock()
		return
	}
	cause := a.timerCause
	if a.headDone && cause == ErrTimeout {
		// A firing of the per-attempt timeout that raced the head's
		// arrival: the timer has been re-armed for the deadline.
		a.mu.Unlock()
		return
	}
	if cause == context.DeadlineExceeded && time.Now().Before(a.deadline) {
		a.mu.Unlock() // early (a re-armed timer's earlier firing)
		return
	}
	if !a.headDone {
		a.byTimer = true
	}
	a.mu.Unlock()
	// The witness's proof needs the connection frozen before anything
	// interrupts it.
	if a.at != nil {
		a.at.FreezeConn()
	}
	err := context.Canceled
	if cause == context.DeadlineExceeded {
		err = context.DeadlineExceeded
	}
	a.end(err, cause)
}

func (a *Ctx) parentEnded() {
	a.end(a.parent.Err(), context.Cause(a.parent))
}

// Finish ends the attempt once it is over (its response, if any, read or
// dropped): its timer and its registration with the parent are released.
func (a *Ctx) Finish() { a.end(context.Canceled, context.Canceled) }

// end ends the attempt with err and cause (the first end wins): it closes
// Done, then (outside the lock) runs the interrupt and starts the
// AfterFunc functions. A reader of Done may see it closed a moment before
// the interrupt has run.
func (a *Ctx) end(err, cause error) {
	a.mu.Lock()
	if a.err != nil {
		a.mu.Unlock()
		return
	}
	if cause == nil {
		cause = err
	}
	a.err, a.cause = err, cause
	hook, funcs, stop := a.hook, a.funcs, a.stopParent
	a.hook, a.funcs, a.stopParent = nil, nil, nil
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.done != nil {
		close(a.done)
	} else {
		a.done = closedChan
	}
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
	if hook != nil {
		hook()
	}
	for _, f := range funcs {
		go f.f()
	}
}
