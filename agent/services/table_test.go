package services

import (
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"
)

func churnSlice(base, n int) *Slice {
	sl := &Slice{Ports: []SlicePort{{Name: "http", Port: 8080}}}
	for i := range n {
		x := base + i
		sl.Endpoints = append(sl.Endpoints, Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(x >> 16), byte(x >> 8), byte(x)}), Ready: true})
	}
	return sl
}

// Thousands of endpoints replaced round after round, requests picking all
// the while: the table's memory stays that of one set, and the request
// path (Pick, Done) never waits for the writer (it takes no lock; -race
// checks the sharing).
func TestChurnKeepsMemoryBounded(t *testing.T) {
	tb := New(Options{})
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	tb.ApplyService(Spec{Namespace: "ns", Name: "big", ClusterIPs: []netip.Addr{vip.Addr()}, Ports: []ServicePort{{Name: "http", Port: 80}}})
	const n = 5000
	tb.ApplySlice("ns", "big", "s1", churnSlice(0, n))
	p := tb.Lookup(vip)
	if r, _ := p.Ready(); r != n {
		t.Fatalf("%d ready, want %d", r, n)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var picks int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			k := p.Endpoints()
			if _, ok := k.Pick(); !ok {
				t.Error("no endpoint picked during churn")
				return
			}
			k.Done(false)
			picks++
		}
	}()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	churn := func(rounds, from int) {
		for r := range rounds {
			// A tenth of the endpoints replaced by new addresses each round.
			tb.ApplySlice("ns", "big", "s1", churnSlice((from+r)*n/10, n))
			tb.TakeGone()
		}
	}
	churn(20, 0)
	before := heap()
	churn(200, 20)
	after := heap()
	close(stop)
	wg.Wait()
	t.Logf("heap after 20 rounds %d KiB, after 200 more %d KiB; %d picks meanwhile", before>>10, after>>10, picks)
	if len(p.known) != n {
		t.Errorf("%d endpoints remembered, want %d", len(p.known), n)
	}
	if after > before+2<<20 {
		t.Errorf("heap grew by %d KiB over 200 rounds of churn", (after-before)>>10)
	}
	if picks == 0 {
		t.Error("no pick ran during the churn")
	}
}

func TestPickPrefersReadyAndAvoidsFailed(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := New(Options{Now: func() time.Time { return now }})
	vip := netip.MustParseAddrPort("10.96.0.11:80")
	tb.ApplyService(Spec{Namespace: "ns", Name: "s", ClusterIPs: []netip.Addr{vip.Addr()}, Ports: []ServicePort{{Name: "", Port: 80}}})
	sl := &Slice{Ports: []SlicePort{{Port: 9000}}, Endpoints: []Endpoint{
		{Addr: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true},
		{Addr: netip.MustParseAddr("10.0.0.2"), Ready: true, Serving: true},
		{Addr: netip.MustParseAddr("10.0.0.3"), Serving: true, Terminating: true},
	}}
	tb.ApplySlice("ns", "s", "a", sl)
	p := tb.Lookup(vip)
	for range 50 {
		k := p.Endpoints()
		a, _ := k.Pick()
		if a == "10.0.0.3:9000" {
			t.Fatal("a terminating endpoint picked while ready ones exist")
		}
		k.Done(true)
		b, _ := k.Pick()
		if b == a {
			t.Fatalf("the retry went back to %s, which failed it", a)
		}
		k.Done(false)
	}
	// Outlier detection: failures in a row set one aside, never both.
	for range 10 {
		k := p.Endpoints()
		k.Pick()
		k.Done(true)
	}
	aside := 0
	for _, a := range []string{"10.0.0.1:9000", "10.0.0.2:9000"} {
		if p.Aside(a) {
			aside++
		}
	}
	if aside != 1 {
		t.Errorf("%d of 2 endpoints set aside, want 1 (never more than half)", aside)
	}
	now = now.Add(time.Minute)
	// No ready endpoint: the terminating-but-serving one serves.
	sl.Endpoints = sl.Endpoints[2:]
	tb.ApplySlice("ns", "s", "a", sl)
	if a, ok := p.Endpoints().Pick(); !ok || a != "10.0.0.3:9000" {
		t.Errorf("with none ready: %q %v, want the serving one", a, ok)
	}
	gone, _ := tb.TakeGone()
	if len(gone) != 2 {
		t.Errorf("gone %v, want the two that left", gone)
	}
	tb.ApplySlice("ns", "s", "a", &Slice{Ports: sl.Ports})
	if _, ok := p.Endpoints().Pick(); ok {
		t.Error("an endpoint picked from an empty slice")
	}
	if p := tb.Named("s.ns.svc.cluster.local", 80); p == nil {
		t.Error("the Service's DNS name is not found")
	}
	if p := tb.Named("s.other.svc", 80); p != nil {
		t.Error("another namespace's name found")
	}
}
