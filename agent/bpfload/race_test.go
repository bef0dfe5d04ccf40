//go:build race

package bpfload_test

// raceEnabled: the race detector drops a quarter of sync.Pool puts, so
// pooled calls allocate now and then; allocation counts are not checked.
const raceEnabled = true
