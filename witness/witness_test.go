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

func TestEndedBeforeAck(t *testing.T) {
	base := Counters{BytesAcked: 66, HasBytesAcked: true, BytesReceived: 40, HasBytesReceived: true, State: StateEstablished}
	with := func(f func(*Counters)) Counters { c := base; f(&c); return c }
	finThenReset := with(func(c *Counters) { c.BytesReceived++; c.State = StateClose })
	for _, tc := range []struct {
		name   string
		before Counters
		after  Counters
		want   bool
	}{
		{"FIN acking nothing, then RST", base, finThenReset, true},
		{"the FIN acked a byte", base, with(func(c *Counters) { c.BytesReceived++; c.State = StateClose; c.BytesAcked++ }), false},
		{"FIN, no RST yet (a half-close may read)", base, with(func(c *Counters) { c.BytesReceived++; c.State = 8 }), false},
		{"a data byte came", base, with(func(c *Counters) { c.BytesReceived += 2; c.State = StateClose }), false},
		{"RST alone (no FIN counted)", base, with(func(c *Counters) { c.State = StateClose }), false},
		{"acked unknown", with(func(c *Counters) { c.HasBytesAcked = false }), finThenReset, false},
		{"received unknown", base, with(func(c *Counters) { *c = finThenReset; c.HasBytesReceived = false }), false},
	} {
		if got := EndedBeforeAck(tc.before, tc.after); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
