// Package heapfloor keeps Go's garbage collector from running while the
// heap is small: the next collection comes no earlier than when the heap
// reaches a floor (a minimum heap goal), and GOGC's own goal takes over
// once the live heap is large enough for it to be above the floor.
//
// Why: with the default GOGC=100 and a live heap of a few MiB, a proxy
// allocating a few KiB per request collects many times a second. Each
// collection costs CPU (mark workers, assists, sweeping) and starts and
// ends with a stop of the world; on a busy machine a stop can last
// milliseconds, as long as it takes the OS to run every thread of the
// process, and every request in flight waits for it. egret's default floor,
// 16 MiB over a live heap of about 4 MiB, makes them about 3 times rarer
// for at most that much memory.
//
// How: after every collection (a cleanup on a sentinel object, re-armed each
// time) the live heap and the roots (stacks and globals) it was scanned with
// are read from runtime/metrics, and GOGC is set so that the collector's
// goal is the floor, but never under base, the GOGC the process had when
// Start was called. The goal is the larger of live + (live+roots)*GOGC/100
// and the runtime's minimum heap, 4 MiB*GOGC/100; so GOGC is at most
// 100*floor/4MiB, or a small heap's goal would be the minimum, far above
// the floor. A memory limit (GOMEMLIMIT) still applies over it: the
// collector runs as the limit nears, floor or not.
package heapfloor

import (
	"math/bits"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// The collector's inputs to its heap goal, as of the last collection
// (Go 1.21).
var samples = []string{"/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes"}

// tuner sets GOGC after each collection.
type tuner struct {
	floor   uint64
	base    int
	stopped atomic.Bool

	mu      sync.Mutex // serialises adjust with stop
	percent int        // the GOGC last set
	sample  []metrics.Sample
}

// sentinel is allocated and dropped so that the next collection runs its
// cleanup. It holds a pointer so that it is never a tiny (combined)
// allocation, whose cleanup may not run.
type sentinel struct {
	_ *byte
	_ [8]byte
}

// Start keeps the heap goal at floor bytes or more until stop is called,
// which puts back the GOGC of the moment Start was called. It does nothing
// (and stop does nothing) for a floor of 0 or when collection is off
// (GOGC=off). Start once per process: two floors would undo each other.
func Start(floor uint64) (stop func()) {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	if floor == 0 || base < 0 {
		return func() {}
	}
	t := &tuner{floor: floor, base: base, percent: base}
	for _, name := range samples {
		t.sample = append(t.sample, metrics.Sample{Name: name})
	}
	t.adjust()
	t.arm()
	return t.stop
}

// arm makes the next collection call t.collected.
func (t *tuner) arm() {
	runtime.AddCleanup(new(sentinel), (*tuner).collected, t)
}

func (t *tuner) collected() {
	if t.stopped.Load() {
		return
	}
	t.adjust()
	t.arm()
}

// adjust sets GOGC for the live heap the last collection found. Small
// changes (under an eighth) are left alone so that a steady heap does not
// reset the collector's pacing after every cycle.
func (t *tuner) adjust() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped.Load() {
		return
	}
	metrics.Read(t.sample)
	var v [3]uint64
	for i, s := range t.sample {
		if s.Value.Kind() != metrics.KindUint64 {
			return // not in this Go: leave GOGC alone
		}
		v[i] = s.Value.Uint64()
	}
	p := Percent(t.floor, v[0], v[1]+v[2], t.base)
	if d := p - t.percent; d != 0 && (p == t.base || d*8 > t.percent || -d*8 > t.percent) {
		debug.SetGCPercent(p)
		t.percent = p
	}
}

func (t *tuner) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped.Swap(true) {
		return
	}
	debug.SetGCPercent(t.base)
}

// maxPercent bounds the GOGC Percent returns (a live heap of a few bytes
// would ask for more than an int holds).
const maxPercent = 1 << 20

// minHeap is the runtime's minimum heap goal at GOGC=100; it scales with
// GOGC (runtime.defaultHeapMinimum). TestGoalIsTheFloor checks it.
const minHeap = 4 << 20

// Percent is the GOGC that puts the collector's heap goal for a live heap
// of live bytes scanned with roots bytes of stacks and globals at floor:
// live + (live+roots)*GOGC/100 at floor or above, the minimum heap
// 4MiB*GOGC/100 not above it; never under base. Before the first
// collection (live 0) the minimum heap is the goal, so the floor holds from
// the start.
func Percent(floor, live, roots uint64, base int) int {
	if live >= floor {
		return base
	}
	scan := live + roots
	if scan < live { // roots past any real size
		return base
	}
	if scan == 0 {
		scan = 1 // nothing collected yet: the minimum heap term alone
	}
	// 100*(floor-live)/scan rounded up, so that the goal is not under the
	// floor; 128-bit, so that no size overflows.
	hi, lo := bits.Mul64(100, floor-live)
	p := uint64(maxPercent)
	if hi < scan {
		q, r := bits.Div64(hi, lo, scan)
		if r > 0 {
			q++
		}
		p = min(q, p)
	}
	// 100*floor/minHeap rounded down, so that the minimum heap is not
	// above the floor (hi < 100 < minHeap: no overflow).
	hi, lo = bits.Mul64(100, floor)
	q, _ := bits.Div64(hi, lo, minHeap)
	p = min(p, q)
	return max(int(p), base)
}
