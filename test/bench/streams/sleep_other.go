//go:build !linux

package main

import "time"

// sleepUntil sleeps until at; elsewhere than on Linux, with the runtime's
// timers.
func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }
