package proxy

import (
	"testing"

	"github.com/egret-proxy/egret/retry"
)

// Recent lists the last traces newest last, before and after the ring
// wraps, and hands out copies.
func TestTracesRecent(t *testing.T) {
	tr := NewTraces(3)
	ids := func(ts []retry.Trace) []string {
		var out []string
		for _, x := range ts {
			out = append(out, x.RequestID)
		}
		return out
	}
	eq := func(got []retry.Trace, want ...string) {
		t.Helper()
		g := ids(got)
		if len(g) != len(want) {
			t.Fatalf("Recent: %v, want %v", g, want)
		}
		for i := range g {
			if g[i] != want[i] {
				t.Fatalf("Recent: %v, want %v", g, want)
			}
		}
	}
	eq(tr.Recent(0))
	for _, id := range []string{"a", "b"} {
		tr.Put(&retry.Trace{RequestID: id, Attempts: []retry.Attempt{{Status: 200}}})
	}
	eq(tr.Recent(0), "a", "b")
	eq(tr.Recent(5), "a", "b")
	eq(tr.Recent(1), "b")
	for _, id := range []string{"c", "d", "e"} {
		tr.Put(&retry.Trace{RequestID: id, Attempts: []retry.Attempt{{Status: 200}}})
	}
	eq(tr.Recent(0), "c", "d", "e")
	eq(tr.Recent(2), "d", "e")
	got := tr.Recent(1)
	got[0].Attempts[0].Status = 599
	if x, _ := tr.Get("e"); x.Attempts[0].Status != 200 {
		t.Fatal("Recent's trace shares the store's attempts")
	}
}
