package heapfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		floor, live, roots uint64
		base, want         int
	}{
		{64 << 20, 4 << 20, 0, 100, 1500},      // goal 4 MiB * 16 = 64 MiB
		{64 << 20, 6 << 20, 0, 100, 967},       // rounded up: the goal is never under the floor
		{64 << 20, 5 << 20, 1 << 20, 100, 984}, // roots count in the goal
		{64 << 20, 3 << 20, 0, 100, 1600},      // the minimum heap is at most the floor
		{64 << 20, 1 << 10, 0, 100, 1600},      // however small the heap
		{32 << 20, 2 << 20, 0, 100, 800},       // another floor
		{64 << 20, 32 << 20, 0, 100, 100},      // GOGC's own goal is the floor already
		{64 << 20, 40 << 20, 0, 100, 100},      // and above it
		{64 << 20, 40 << 20, 0, 50, 60},        // a base under 100: the floor still holds
		{64 << 20, 64 << 20, 0, 100, 100},      // live at the floor
		{64 << 20, 80 << 20, 0, 100, 100},      // live above it
		{64 << 20, 4 << 20, 0, 2000, 2000},     // a base above what the floor asks
		{64 << 20, 0, 1 << 20, 100, 1600},      // nothing collected yet: the minimum heap is the goal
		{1 << 40, 1, 0, 100, maxPercent},       // bounded
		{1 << 63, 1, 0, 100, maxPercent},       // without overflow
		{1 << 63, 1 << 62, 1 << 62, 100, 100},  // without overflow
		{1<<63 + 1<<62, 1 << 62, 0, 100, 200},  // without overflow
	} {
		got := Percent(c.floor, c.live, c.roots, c.base)
		if got != c.want {
			t.Errorf("Percent(%d, %d, %d, %d) = %d, want %d", c.floor, c.live, c.roots, c.base, got, c.want)
		}
		if got == c.base || got == maxPercent {
			continue
		}
		g, f := float64(got)/100, float64(c.floor)
		goal := max(float64(c.live)+float64(c.live+c.roots)*g, minHeap*g)
		if goal < f || goal > f*1.02 {
			t.Errorf("Percent(%d, %d, %d, %d) = %d: goal %.0f is not the floor", c.floor, c.live, c.roots, c.base, got, goal)
		}
	}
}

// gcPercent reads GOGC without changing it.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func read(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// The runtime's own heap goal, with the floor set for a small heap, is the
// floor: this holds Percent's model of the goal (its minimum heap above all)
// to the Go that runs it.
func TestGoalIsTheFloor(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, floor := range []uint64{16 << 20, 64 << 20, 256 << 20} {
		stop := Start(floor)
		runtime.GC()
		eventually(t, "a GOGC above 100", func() bool { return gcPercent() > 100 })
		goal := read("/gc/heap/goal:bytes")
		t.Logf("floor %d MiB: GOGC %d, goal %.1f MiB (live %d KiB)", floor>>20, gcPercent(), float64(goal)/(1<<20), read("/gc/heap/live:bytes")>>10)
		if goal < floor || goal > floor+floor/10 {
			t.Errorf("floor %d: the runtime's heap goal is %d, want the floor (up to a tenth above)", floor, goal)
		}
		stop()
	}
}

func cycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

var (
	sink []byte
	held [][]byte // live (a global, so that the compiler cannot find it dead)
)

// churn allocates n bytes of garbage in 32 KiB pieces and returns how many
// collections ran meanwhile.
func churn(n int) uint64 {
	c0 := cycles()
	for i := 0; i < n; i += 32 << 10 {
		sink = make([]byte, 32<<10)
	}
	sink = nil
	return cycles() - c0
}

// eventually waits for cond, which the cleanup goroutine makes true. Polls:
// the floor acts from a runtime.AddCleanup after a collection, on the
// runtime's cleanup goroutine, which tells no one; each round collects
// again so that there is a cleanup to run.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, what, func() bool {
		if cond() {
			return true
		}
		runtime.GC()
		return false
	})
}

// With a small live heap, the floor makes collections several times rarer
// for the same garbage, and stop puts the process's GOGC back.
func TestFloorDefersCollections(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	runtime.GC()
	const garbage = 512 << 20
	without := churn(garbage)

	stop := Start(64 << 20)
	eventually(t, "a GOGC above 100", func() bool { return gcPercent() > 100 })
	with := churn(garbage)
	t.Logf("collections for %d MiB of garbage: %d without a floor, %d with a 64 MiB floor (GOGC %d)", garbage>>20, without, with, gcPercent())
	if with*4 > without || with == 0 {
		t.Errorf("%d collections with the floor, %d without: want at least 4 times fewer", with, without)
	}
	stop()
	if p := gcPercent(); p != 100 {
		t.Errorf("GOGC after stop = %d, want 100", p)
	}
	// Nothing more changes it once stopped.
	runtime.GC()
	runtime.GC()
	// Not synchronisation: a window in which a cleanup left running would
	// act; what is checked is that nothing does (an absence).
	time.Sleep(20 * time.Millisecond)
	if p := gcPercent(); p != 100 {
		t.Errorf("GOGC after stop and two collections = %d, want 100", p)
	}
}

// A live heap larger than half the floor gets GOGC's own goal back.
func TestFloorYieldsToALargeHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	stop := Start(32 << 20)
	defer stop()
	eventually(t, "a GOGC above 100 for a small heap", func() bool { return gcPercent() > 100 })

	for range 48 {
		held = append(held, make([]byte, 1<<20))
	}
	eventually(t, "GOGC 100 for a 48 MiB live heap", func() bool { return gcPercent() == 100 })

	held = nil
	eventually(t, "a GOGC above 100 once the heap is small again", func() bool { return gcPercent() > 100 })
}

// The process's GOGC is the base: a floor never lowers it, and GOGC=off
// (or a floor of 0) leaves collection alone.
func TestFloorKeepsTheBase(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))

	debug.SetGCPercent(-1)
	stop := Start(64 << 20)
	runtime.GC()
	time.Sleep(20 * time.Millisecond) // not synchronisation: a window for the cleanup to act, which it must not
	if p := gcPercent(); p != -1 {
		t.Errorf("GOGC off, after Start: %d, want -1 (off)", p)
	}
	stop()

	debug.SetGCPercent(300)
	stop = Start(0)
	runtime.GC()
	time.Sleep(20 * time.Millisecond) // not synchronisation: as above, GOGC must stay
	if p := gcPercent(); p != 300 {
		t.Errorf("floor 0: GOGC %d, want 300", p)
	}
	stop()

	stop = Start(1 << 20) // below any live heap of a test binary's GOGC=300 goal
	held = [][]byte{make([]byte, 2<<20)}
	runtime.GC()
	time.Sleep(20 * time.Millisecond) // not synchronisation: as above, GOGC must stay at the base
	if p := gcPercent(); p != 300 {
		t.Errorf("floor below the live heap: GOGC %d, want the base 300", p)
	}
	held = nil
	stop()
	if p := gcPercent(); p != 300 {
		t.Errorf("after stop: GOGC %d, want 300", p)
	}
}
