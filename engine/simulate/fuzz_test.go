package simulate

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
)

// FuzzParse feeds arbitrary lines to the simulate parser. Whatever the line,
// parsing must not panic; a line it accepts must give a well-formed answer
// whose delay respects the bounds of spec section 4; a line it refuses gets
// an error naming why. The seed corpus lives in testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"attempt":1,"failure":"write_failed"}`,
		`{"attempt":2,"status":429,"retry_after_ms":300,"deadline_remaining_ms":5000}`,
		`{"attempt":1,"backoff":{"kind":"decorrelated","base_ms":100,"max_ms":5000,"prev_ms":400},"failure":"connect_timeout"}`,
		`{"attempt":1,"status":500,"transient_statuses":[500],"idempotent":true}`,
		`{"attempt":-1}`, `{}`, `[]`, `null`, `{"attempt":1e400}`, `{"attempt":1,"failure":null,"status":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		in, err := Parse(line)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if in.Attempt < 1 || in.MaxAttempts < 1 || in.BudgetTokens < 0 || in.MinAttempt < 0 {
			t.Fatalf("accepted out-of-range input %+v from %q", in, line)
		}
		for _, rnd := range []engine.Rand{lowEnd{}, highEnd{}} {
			a := Decide(&in, rnd)
			if a.Decision == "" || a.Reason == "" || strings.HasPrefix(a.Reason, "reason(") {
				t.Fatalf("malformed answer %+v for %q", a, line)
			}
			if (a.DelayMS != nil) != (a.Decision == "retry") {
				t.Fatalf("delay presence wrong in %+v", a)
			}
			if a.DelayMS != nil {
				d := time.Duration(*a.DelayMS) * time.Millisecond
				if d < 0 {
					t.Fatalf("negative delay %v for %q", d, line)
				}
				if in.HasDeadline && d > in.DeadlineRemaining-in.MinAttempt {
					t.Fatalf("delay %v beyond the deadline's room for %q", d, line)
				}
				limit := max(in.Backoff.Max, in.RetryAfter)
				if d > limit {
					t.Fatalf("delay %v above max(max_backoff, retry_after) for %q", d, line)
				}
			}
			var buf bytes.Buffer
			if err := json.NewEncoder(&buf).Encode(a); err != nil || !json.Valid(buf.Bytes()) {
				t.Fatalf("answer does not encode: %v", err)
			}
		}
	})
}

type lowEnd struct{}

func (lowEnd) Int64N(int64) int64 { return 0 }

type highEnd struct{}

func (highEnd) Int64N(n int64) int64 { return n - 1 }
