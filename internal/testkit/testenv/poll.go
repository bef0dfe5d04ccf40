package testenv

import (
	"testing"
	"time"
)

// Poll calls cond until it reports true or timeout has passed, and says
// whether it did. It is for the states that announce nothing: another
// process's log or API, a kernel counter (TCP_INFO, a bpf map), an API
// server's objects, a flag. Where the code under test has an event (a
// channel, a hook, a watch, inotify, netlink, a readable socket), a test
// waits on that instead. The pauses between calls grow from 1 ms to 50 ms,
// so that a state that comes at once is seen at once and a long wait costs
// little CPU. A test that asserts with its own message after the wait uses
// Poll; one whose message is what it waited for uses Eventually.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause) // the poll's pause: cond's state has no event
	}
}

// Eventually polls cond as Poll does and fails the test, naming what it
// waited for and for how long, if cond never held within timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(timeout, cond) {
		t.Fatalf("not within %v: %s", timeout, what)
	}
}

// EventuallyNoError polls check until it returns nil, as Eventually does,
// and fails the test with what it waited for and check's last error.
func EventuallyNoError(t testing.TB, timeout time.Duration, what string, check func() error) {
	t.Helper()
	var last error
	if !Poll(timeout, func() bool { last = check(); return last == nil }) {
		t.Fatalf("not within %v: %s (last: %v)", timeout, what, last)
	}
}
