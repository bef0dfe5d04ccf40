package smuggle

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
)

const corpus = "testdata/cases.jsonl"

// TestDifferential runs every case of the corpus through a real egret, in
// explicit and in transparent mode, each followed by an innocent request on
// the same connection, in front of the strict upstream: what egret
// forwarded must parse to exactly the requests egret logged, or egret
// refused. 0 desyncs.
func TestDifferential(t *testing.T) {
	cases, err := LoadCases(corpus)
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) < 500 {
		t.Fatalf("%d cases in %s: the corpus is meant to have hundreds", len(cases), corpus)
	}
	if id := os.Getenv("EGRET_SMUGGLE_CASE"); id != "" {
		cases = filter(cases, id)
	}
	for _, mode := range []Mode{Explicit, Transparent} {
		t.Run(string(mode), func(t *testing.T) {
			e, err := NewEgret(mode)
			if err != nil {
				t.Fatal(err)
			}
			results := runAll(t, e, cases)
			counts := map[string]int{}
			for _, r := range results {
				counts[r.Verdict.Class]++
				if r.Verdict.Class == Desync {
					t.Errorf("%s: desync in %s mode:\n  %s\n  egret logged %s\n  upstream read %q\n  raw %q",
						r.Case.ID, mode, strings.Join(r.Verdict.Reasons, "\n  "), logSummary(r.Logs), r.Verdict.Upstream, clip([]byte(r.Case.Raw)))
				}
				if r.Stalled {
					t.Errorf("%s: egret neither answered nor closed within %v of the client's half-close", r.Case.ID, ClientDeadline)
				}
			}
			line := fmt.Sprintf("smuggle %s: %d cases, %d refused, %d forwarded, %d piped, %d desync",
				mode, len(results), counts[Refused], counts[Forwarded], counts[Piped], counts[Desync])
			t.Log(line)
			// The summary line goes to the test's output as well, where CI shows it
			// without -v.
			fmt.Println(line)
			if counts[Refused] == 0 || counts[Forwarded] == 0 {
				t.Errorf("the corpus must exercise both refusals and forwards: %v", counts)
			}
		})
	}
}

func filter(cases []Case, prefix string) []Case {
	var out []Case
	for _, c := range cases {
		if strings.HasPrefix(c.ID, prefix) {
			out = append(out, c)
		}
	}
	return out
}

func logSummary(ls []Logged) string {
	var parts []string
	for _, l := range ls {
		parts = append(parts, fmt.Sprintf("[%s %s %s attempts=%d status=%d]", l.Method, l.URL, l.Outcome, l.Attempts, l.Status))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, " ")
}

// runAll runs the cases on a few workers, each case on its own proxy and
// upstream, and returns the results in corpus order.
func runAll(t *testing.T, e *Egret, cases []Case) []*Result {
	results := make([]*Result, len(cases))
	next := make(chan int)
	var wg sync.WaitGroup
	workers := max(4, 2*runtime.GOMAXPROCS(0))
	for range workers {
		wg.Go(func() {
			for i := range next {
				r, err := e.Run(&cases[i])
				if err != nil {
					t.Errorf("%s: %v", cases[i].ID, err)
					r = &Result{Case: &cases[i], Mode: e.Mode, Verdict: Verdict{Class: "error"}}
				}
				results[i] = r
			}
		})
	}
	for i := range cases {
		next <- i
	}
	close(next)
	wg.Wait()
	sort.SliceStable(results, func(i, j int) bool { return results[i].Case.ID < results[j].Case.ID })
	return results
}
