package attempt

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// The context itself, without a network.

func TestAttemptCtxTimerBeforeTheHead(t *testing.T) {
	var a Ctx
	at := &Trace{}
	a.Start(context.Background(), at, time.Now().Add(time.Hour), 20*time.Millisecond)
	if a.at != at {
		t.Fatal("the attempt's trace is not the one it was started with")
	}
	if dl, ok := a.Deadline(); !ok || time.Until(dl) < 59*time.Minute {
		t.Fatalf("deadline %v %v", dl, ok)
	}
	child, stopChild := context.WithCancel(&a)
	defer stopChild()
	hooked := make(chan struct{})
	var once sync.Once
	a.SetHook(func() { once.Do(func() { close(hooked) }) })
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the attempt timeout did not end the attempt")
	}
	if !a.TimedOut() || !a.HeadArrived() {
		t.Fatal("not told as timed out")
	}
	if a.Cause() != ErrTimeout || !errors.Is(a.Err(), context.Canceled) {
		t.Fatalf("cause %v, err %v", a.Cause(), a.Err())
	}
	select {
	case <-hooked:
	case <-time.After(5 * time.Second):
		t.Fatal("the interrupt did not run")
	}
	if a.ClearHook() {
		t.Fatal("clearHook reports a running attempt after its end")
	}
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a child context was not ended")
	}
}

func TestAttemptCtxHeadThenDeadline(t *testing.T) {
	var a Ctx
	a.Start(context.Background(), nil, time.Now().Add(time.Second), 200*time.Millisecond)
	if a.HeadArrived() {
		t.Fatal("late at once")
	}
	hooked := make(chan struct{})
	var once sync.Once
	a.SetHook(func() { once.Do(func() { close(hooked) }) })
	time.Sleep(400 * time.Millisecond) // not synchronisation: time past the attempt timeout, which must not end it
	if a.Err() != nil || a.TimedOut() {
		t.Fatalf("ended by the attempt timeout after the head: %v", a.Err())
	}
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the deadline did not end the attempt")
	}
	if a.Err() != context.DeadlineExceeded || a.Cause() != context.DeadlineExceeded || a.TimedOut() {
		t.Fatalf("err %v, cause %v, timedOut %v", a.Err(), a.Cause(), a.TimedOut())
	}
	// Done closes first; the interrupt follows at once, outside the lock.
	select {
	case <-hooked:
	case <-time.After(5 * time.Second):
		t.Fatal("the interrupt did not run at the deadline")
	}
}

func TestAttemptCtxParentAndFinish(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.Background())
	var a Ctx
	a.Start(parent, nil, time.Time{}, 0)
	if _, ok := a.Deadline(); ok || a.timer != nil {
		t.Fatal("a deadline or a timer without bounds")
	}
	ran := make(chan struct{})
	stop := context.AfterFunc(&a, func() { close(ran) })
	stopped := context.AfterFunc(&a, func() { t.Error("a stopped function ran") })
	if !stopped() {
		t.Fatal("stop before the end reports false")
	}
	why := errors.New("gone")
	cancel(why)
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("the parent's end did not reach AfterFunc")
	}
	if stop() {
		t.Fatal("stop after the function started reports true")
	}
	if a.Cause() != why || a.Err() != context.Canceled {
		t.Fatalf("cause %v, err %v", a.Cause(), a.Err())
	}
	a.Finish() // a second end changes nothing
	if a.Cause() != why {
		t.Fatalf("cause %v after finish", a.Cause())
	}

	// finish alone: the attempt is over; Done asked only now is closed.
	var b Ctx
	b.Start(context.Background(), nil, time.Now().Add(time.Hour), time.Hour)
	b.Finish()
	select {
	case <-b.Done():
	default:
		t.Fatal("Done not closed after finish")
	}
	if b.TimedOut() || b.Cause() != context.Canceled {
		t.Fatalf("timedOut %v, cause %v", b.TimedOut(), b.Cause())
	}
}

func TestAttemptCtxAllocations(t *testing.T) {
	// Its hot path: start with a timeout and a deadline, the head, a hook
	// set and cleared, finish; the context itself allocates only its timer
	// and the timer's function.
	n := testing.AllocsPerRun(200, func() {
		a := new(Ctx)
		a.Start(context.Background(), nil, time.Now().Add(time.Hour), time.Minute)
		a.SetHook(func() {})
		a.HeadArrived()
		a.ClearHook()
		a.Finish()
	})
	if n > 4 {
		t.Fatalf("%.0f allocations per attempt", n)
	}
}

// TestAttemptCtxDeadlineAlreadyPassed: a deadline already behind when the
// attempt starts ends it at once, with the deadline's error, and as timed
// out (its timer fires while start is still arming it: run with -race).
func TestAttemptCtxDeadlineAlreadyPassed(t *testing.T) {
	for range 200 {
		var a Ctx
		a.Start(context.Background(), nil, time.Now().Add(-time.Millisecond), time.Hour)
		select {
		case <-a.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("a passed deadline did not end the attempt")
		}
		if a.Err() != context.DeadlineExceeded || !a.TimedOut() {
			t.Fatalf("err %v, timedOut %v", a.Err(), a.TimedOut())
		}
	}
}
