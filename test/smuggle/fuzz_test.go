package smuggle

import (
	"flag"
	"strings"
	"testing"
)

// FuzzDifferential mutates the corpus's cases and runs each mutation as
// TestDifferential runs a case: through a real egret (explicit or
// transparent) in front of the strict upstream, followed by the innocent
// request. Whatever the bytes, egret must refuse them or forward exactly
// what it logged; it must never stall.
//
// Under -fuzz every case of the corpus is a seed, in both modes; a plain
// go test runs one case of each class (TestDifferential runs them all).
//
//	go test -run '^$' -fuzz FuzzDifferential -fuzztime 5m ./test/smuggle
func FuzzDifferential(f *testing.F) {
	cases, err := LoadCases(corpus)
	if err != nil {
		f.Fatal(err)
	}
	fuzzing := flag.Lookup("test.fuzz").Value.String() != ""
	seen := map[string]bool{}
	for _, c := range cases {
		if !fuzzing && seen[c.Class] {
			continue
		}
		seen[c.Class] = true
		raw, err := Latin1(c.Raw)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw, false)
		f.Add(raw, true)
	}
	if len(seen) < 10 {
		f.Fatalf("%d classes in the corpus", len(seen))
	}
	egrets := map[Mode]*Egret{}
	for _, m := range []Mode{Explicit, Transparent} {
		e, err := NewEgret(m)
		if err != nil {
			f.Fatal(err)
		}
		egrets[m] = e
	}
	f.Fuzz(func(t *testing.T, raw []byte, transparent bool) {
		mode := Explicit
		if transparent {
			mode = Transparent
		}
		c := &Case{ID: "fuzz", Raw: ToLatin1(raw)}
		r, err := egrets[mode].Run(c)
		if err != nil {
			t.Fatal(err)
		}
		if r.Stalled {
			t.Fatalf("egret neither answered nor closed within %v of the client's half-close: raw %q", ClientDeadline, raw)
		}
		if r.Verdict.Class == Desync {
			t.Fatalf("desync in %s mode:\n  %s\n  egret logged %s\n  upstream read %q\n  raw %q",
				mode, strings.Join(r.Verdict.Reasons, "\n  "), logSummary(r.Logs), r.Verdict.Upstream, raw)
		}
	})
}
