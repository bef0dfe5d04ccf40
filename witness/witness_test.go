package witness

import (
	"errors"
	"testing"
)

func full(sent, segs uint64) Counters {
	return Counters{BytesSent: sent, HasBytesSent: true, DataSegsOut: segs, HasDataSegsOut: true}
}

func TestNoByteLeft(t *testing.T) {
	queued := full(10, 2)
	queued.NotSentBytes, queued.HasNotSentBytes = 40, true
	discarded := queued
	discarded.QueueDiscarded = true
	for _, tc := range []struct {
		name          string
		before, after Counters
		want          bool
	}{
		{"unchanged", full(10, 2), full(10, 2), true},
		{"bytes moved", full(10, 2), full(11, 2), false},
		{"segments moved", full(10, 2), full(10, 3), false},
		{"unreadable before", Counters{}, full(0, 0), false},
		{"unreadable after", full(0, 0), Counters{BytesSent: 0, HasBytesSent: true}, false},
		{"request still queued", full(10, 2), queued, false},
		{"queue discarded", full(10, 2), discarded, true},
	} {
		if got := NoByteLeft(tc.before, tc.after); got != tc.want {
			t.Errorf("%s: NoByteLeft = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestMemoryScript(t *testing.T) {
	m := NewMemory(full(1, 1), full(2, 2))
	for i, want := range []uint64{1, 2, 2} {
		c, err := m.Snapshot(nil)
		if err != nil || c.BytesSent != want || c.Source != "memory" {
			t.Fatalf("snapshot %d: %+v %v", i, c, err)
		}
	}
	if m.Calls() != 3 {
		t.Fatalf("calls %d", m.Calls())
	}
	boom := errors.New("boom")
	m.Fail(boom)
	if _, err := m.Snapshot(nil); !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	m.Fail(nil)
	m.Set()
	if _, err := m.Snapshot(nil); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("empty script: %v", err)
	}
}
