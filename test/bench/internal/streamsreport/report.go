// Package streamsreport is the line test/bench/streams prints and
// test/bench reads: one JSON object per run, durations in nanoseconds.
package streamsreport

import "time"

// Report is one run of streams.
type Report struct {
	// Error is why the run could not be made (its other fields are then
	// empty): a connection refused, or a first answer that is not the
	// one checked for (no Egret-Attempts: egret was not in the way).
	Error    string  `json:"error,omitempty"`
	Requests int64   `json:"requests"` // answers as checked, in the measured window
	Errors   int64   `json:"errors"`   // socket and protocol errors, timeouts
	Bad      int64   `json:"bad"`      // answers not as checked (status, length, header)
	Rate     float64 `json:"rate"`     // Requests over the window's length
	// FirstError is the first error or bad answer, if any.
	FirstError string        `json:"first_error,omitempty"`
	P50        time.Duration `json:"p50_ns"`
	P90        time.Duration `json:"p90_ns"`
	P99        time.Duration `json:"p99_ns"`
	P999       time.Duration `json:"p999_ns"`
	Max        time.Duration `json:"max_ns"`
	// LateP50 and LateP99 (paced runs): how late the generator woke for
	// its sends, a floor in every latency.
	LateP50 time.Duration `json:"late_p50_ns"`
	LateP99 time.Duration `json:"late_p99_ns"`
	// CPU is the user + system CPU time of -cpu-pid's process over the
	// measured window (0 without one).
	CPU time.Duration `json:"cpu_ns"`
}
