package testenv

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	var n atomic.Int32
	if !Poll(5*time.Second, func() bool { return n.Add(1) == 3 }) {
		t.Fatal("Poll gave up on a condition that held on the third call")
	}
	start := time.Now()
	if Poll(30*time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll reported a condition that never held")
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("Poll gave up after %v, before its 30ms", d)
	}
}

// fake records a test's failure without ending the real test.
type fake struct {
	testing.TB
	msg string
}

func (f *fake) Helper()                        {}
func (f *fake) Fatalf(format string, a ...any) { f.msg = fmt.Sprintf(format, a...) }

func TestEventuallyNamesWhatItWaitedFor(t *testing.T) {
	f := &fake{TB: t}
	Eventually(f, time.Millisecond, "the thing", func() bool { return false })
	if !strings.Contains(f.msg, "the thing") {
		t.Fatalf("Eventually's failure %q does not say what it waited for", f.msg)
	}
	f.msg = ""
	EventuallyNoError(f, time.Millisecond, "the thing", func() error { return errors.New("no") })
	if !strings.Contains(f.msg, "the thing") || !strings.Contains(f.msg, "last: no") {
		t.Fatalf("EventuallyNoError's failure %q lacks what it waited for or the last error", f.msg)
	}
}
