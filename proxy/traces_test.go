package proxy

import (
	"testing"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry"
)

// A watch gets copies of the traces of its outcome only, Put never waits
// for it (what does not fit its buffer is counted), and stop closes it.
func TestTracesWatch(t *testing.T) {
	tr := NewTraces(8)
	ch, stop := tr.Watch(engine.OutcomeAmbiguous, 2)
	put := func(id string, o engine.Outcome) {
		tr.Put(&retry.Trace{RequestID: id, Outcome: o, Attempts: []retry.Attempt{{}}})
	}
	put("a", engine.OutcomeAmbiguous)
	put("b", engine.OutcomeNone)
	put("c", engine.OutcomeAmbiguous)
	put("d", engine.OutcomeAmbiguous) // the buffer holds 2: dropped
	got := []string{(<-ch).RequestID, (<-ch).RequestID}
	if got[0] != "a" || got[1] != "c" {
		t.Fatalf("watched %v, want [a c]", got)
	}
	if n := stop(); n != 1 {
		t.Fatalf("dropped %d, want 1", n)
	}
	if _, ok := <-ch; ok {
		t.Fatal("channel not closed by stop")
	}
	put("e", engine.OutcomeAmbiguous) // no watcher: nothing sent, no panic
	if n := stop(); n != 1 {
		t.Fatalf("a second stop: dropped %d", n)
	}
	// The copies are the watcher's own.
	ch2, stop2 := tr.Watch(engine.OutcomeAmbiguous, 1)
	orig := &retry.Trace{RequestID: "f", Outcome: engine.OutcomeAmbiguous, Attempts: []retry.Attempt{{}}}
	tr.Put(orig)
	w := <-ch2
	orig.Attempts[0].Status = 599
	if w.Attempts[0].Status == 599 {
		t.Fatal("the watcher's trace shares the caller's attempts")
	}
	stop2()
}
