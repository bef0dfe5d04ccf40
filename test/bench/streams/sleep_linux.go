//go:build linux

package main

import (
	"syscall"
	"time"
)

const prSetTimerslack = 29 // PR_SET_TIMERSLACK, <linux/prctl.h>

// sleepUntil sleeps until at in nanosleep(2) rather than time.Sleep: the
// runtime's timers wake from epoll_wait in whole milliseconds, which would
// make sends up to a millisecond late. With the thread's timer slack
// lowered from 50 µs to 1 ns first, a send is late by some tens of µs (the
// thread is held while it sleeps; the runtime hands its P on).
func sleepUntil(at time.Time) {
	syscall.Syscall(syscall.SYS_PRCTL, prSetTimerslack, 1, 0)
	for {
		d := time.Until(at)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(int64(d))
		// EINTR (the runtime's preemption signal): sleep what is left.
		syscall.Nanosleep(&ts, nil)
	}
}
