package proxy

import (
	"slices"
	"testing"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry"
)

// Latest lists the newest traces of the outcomes asked for, newest
// first, before and after the ring wraps, and hands out copies.
func TestTracesLatest(t *testing.T) {
	tr := NewTraces(4)
	ids := func(ts []retry.Trace) []string {
		out := []string{}
		for _, x := range ts {
			out = append(out, x.RequestID)
		}
		return out
	}
	put := func(id string, o engine.Outcome) {
		tr.Put(&retry.Trace{RequestID: id, Outcome: o, Attempts: []retry.Attempt{{Status: 200}}})
	}
	eq := func(got []retry.Trace, want ...string) {
		t.Helper()
		if g := ids(got); !slices.Equal(g, append([]string{}, want...)) {
			t.Fatalf("Latest: %v, want %v", g, want)
		}
	}
	eq(tr.Latest(10))
	put("a", engine.OutcomeAmbiguous)
	put("b", engine.OutcomeNone)
	eq(tr.Latest(10), "b", "a")
	eq(tr.Latest(1), "b")
	eq(tr.Latest(10, engine.OutcomeAmbiguous, engine.OutcomeNotSent), "a")
	put("c", engine.OutcomeNotSent)
	put("d", engine.OutcomeNone)
	put("e", engine.OutcomeAmbiguous) // pushes a out
	put("f", engine.OutcomeNone)      // pushes b out
	eq(tr.Latest(10), "f", "e", "d", "c")
	eq(tr.Latest(10, engine.OutcomeAmbiguous, engine.OutcomeNotSent), "e", "c")
	eq(tr.Latest(1, engine.OutcomeAmbiguous, engine.OutcomeNotSent), "e")
	got := tr.Latest(1)
	got[0].Attempts[0].Status = 599
	if x, _ := tr.Get("f"); x.Attempts[0].Status != 200 {
		t.Fatal("Latest's trace shares the store's attempts")
	}
}
