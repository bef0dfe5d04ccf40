// Package pacereport is the line test/bench/pace prints and test/bench
// reads: one JSON object per run, durations in nanoseconds.
package pacereport

import "time"

// Report is one paced run.
type Report struct {
	Requests int64         `json:"requests"` // answers in the measured window
	Total    int64         `json:"total"`    // with the warmup's
	Errors   int64         `json:"errors"`   // socket errors and timeouts
	Non2xx   int64         `json:"non2xx"`
	Rate     float64       `json:"rate"` // achieved requests/s in the window
	P50      time.Duration `json:"p50_ns"`
	P90      time.Duration `json:"p90_ns"`
	P99      time.Duration `json:"p99_ns"`
	P999     time.Duration `json:"p999_ns"`
	Max      time.Duration `json:"max_ns"`
	// LateP50 and LateP99: how late the generator woke for its sends.
	LateP50 time.Duration `json:"late_p50_ns"`
	LateP99 time.Duration `json:"late_p99_ns"`
}
