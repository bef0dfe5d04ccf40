package retry

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The attempt's bounds over real connections: the per-attempt timeout
// bounds the wait for the head only, the overall deadline the body too, and
// the caller's context both.

// slowBodyServer answers with a head at once and its body in pieces, gap
// apart.
func slowBodyServer(t *testing.T, pieces int, gap time.Duration) *rawServer {
	return newRawServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		if _, _, err := readReq(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(pieces)+"\r\n\r\n")
		for range pieces {
			time.Sleep(gap) // not synchronisation: the slow body under test
			if _, err := io.WriteString(c, "x"); err != nil {
				return
			}
		}
		io.Copy(io.Discard, br)
	})
}

func TestAttemptTimeoutDoesNotCutTheBody(t *testing.T) {
	// The body takes 3 × 400 ms, well past the 300 ms attempt timeout: the
	// head came in time, so the body is read whole.
	srv := slowBodyServer(t, 3, 400*time.Millisecond)
	tr, _, _ := testTransport(t, func(p *Policy) {
		p.AttemptTimeout = 300 * time.Millisecond
		p.Timeout = 5 * time.Second
	})
	resp, err := tr.RoundTrip(get(t, srv.url()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "xxx" {
		t.Fatalf("body %q, %v", b, err)
	}
}

func TestDeadlineEndsASlowBody(t *testing.T) {
	// The overall deadline (300 ms) passes while the body trickles in.
	srv := slowBodyServer(t, 9, 100*time.Millisecond)
	tr, _, _ := testTransport(t, func(p *Policy) {
		p.AttemptTimeout = 100 * time.Millisecond
		p.Timeout = 300 * time.Millisecond
	})
	start := time.Now()
	resp, err := tr.RoundTrip(get(t, srv.url()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("body %q, err %v: want the deadline's", b, err)
	}
	if took < 250*time.Millisecond || took > 2*time.Second {
		t.Fatalf("the body ended after %v, want about 300 ms", took)
	}
}

func TestCallerCancelEndsTheWaitForTheHead(t *testing.T) {
	var executed atomic.Int64
	srv := slowServer(t, &executed)
	tr, _, _ := testTransport(t, func(p *Policy) {
		p.AttemptTimeout = 5 * time.Second
		p.Timeout = 10 * time.Second
	})
	ctx, cancel := context.WithCancelCause(context.Background())
	why := errors.New("the client left")
	time.AfterFunc(100*time.Millisecond, func() { cancel(why) })
	start := time.Now()
	_, err := tr.RoundTrip(post(t, srv.url(), "charge").WithContext(ctx))
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("RoundTrip returned after %v", took)
	}
	var a *AmbiguousError
	if !errors.As(err, &a) || !errors.Is(err, why) || a.Attempts != 1 {
		t.Fatalf("err %v, want ambiguous with the caller's cause after 1 attempt", err)
	}
}

// The context itself, without a network.

func TestAttemptCtxTimerBeforeTheHead(t *testing.T) {
	var a attemptCtx
	at := &attemptTrace{}
	a.start(context.Background(), at, time.Now().Add(time.Hour), 20*time.Millisecond)
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
	a.setHook(func() { once.Do(func() { close(hooked) }) })
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the attempt timeout did not end the attempt")
	}
	if !a.timedOut() || !a.headArrived() {
		t.Fatal("not told as timed out")
	}
	if a.Cause() != errAttemptTimeout || !errors.Is(a.Err(), context.Canceled) {
		t.Fatalf("cause %v, err %v", a.Cause(), a.Err())
	}
	select {
	case <-hooked:
	case <-time.After(5 * time.Second):
		t.Fatal("the interrupt did not run")
	}
	if a.clearHook() {
		t.Fatal("clearHook reports a running attempt after its end")
	}
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a child context was not ended")
	}
}

func TestAttemptCtxHeadThenDeadline(t *testing.T) {
	var a attemptCtx
	a.start(context.Background(), nil, time.Now().Add(time.Second), 200*time.Millisecond)
	if a.headArrived() {
		t.Fatal("late at once")
	}
	hooked := make(chan struct{})
	var once sync.Once
	a.setHook(func() { once.Do(func() { close(hooked) }) })
	time.Sleep(400 * time.Millisecond) // not synchronisation: time past the attempt timeout, which must not end it
	if a.Err() != nil || a.timedOut() {
		t.Fatalf("ended by the attempt timeout after the head: %v", a.Err())
	}
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the deadline did not end the attempt")
	}
	if a.Err() != context.DeadlineExceeded || a.Cause() != context.DeadlineExceeded || a.timedOut() {
		t.Fatalf("err %v, cause %v, timedOut %v", a.Err(), a.Cause(), a.timedOut())
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
	var a attemptCtx
	a.start(parent, nil, time.Time{}, 0)
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
	a.finish() // a second end changes nothing
	if a.Cause() != why {
		t.Fatalf("cause %v after finish", a.Cause())
	}

	// finish alone: the attempt is over; Done asked only now is closed.
	var b attemptCtx
	b.start(context.Background(), nil, time.Now().Add(time.Hour), time.Hour)
	b.finish()
	select {
	case <-b.Done():
	default:
		t.Fatal("Done not closed after finish")
	}
	if b.timedOut() || b.Cause() != context.Canceled {
		t.Fatalf("timedOut %v, cause %v", b.timedOut(), b.Cause())
	}
}

func TestAttemptCtxAllocations(t *testing.T) {
	// Its hot path: start with a timeout and a deadline, the head, a hook
	// set and cleared, finish; the context itself allocates only its timer
	// and the timer's function.
	n := testing.AllocsPerRun(200, func() {
		a := new(attemptCtx)
		a.start(context.Background(), nil, time.Now().Add(time.Hour), time.Minute)
		a.setHook(func() {})
		a.headArrived()
		a.clearHook()
		a.finish()
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
		var a attemptCtx
		a.start(context.Background(), nil, time.Now().Add(-time.Millisecond), time.Hour)
		select {
		case <-a.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("a passed deadline did not end the attempt")
		}
		if a.Err() != context.DeadlineExceeded || !a.timedOut() {
			t.Fatalf("err %v, timedOut %v", a.Err(), a.timedOut())
		}
	}
}
