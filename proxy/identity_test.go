package proxy

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/dnstest"
)

// TestNamesLookups: Names asks egret's resolver once for a burst of
// requests, keeps the answer, asks again for an address missing from it
// only as often as Refresh allows (a moved service is recognised), and
// bounds how many names it keeps.
func TestNamesLookups(t *testing.T) {
	dns := dnstest.Start(t)
	a1, a2 := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2")
	dns.Set("svc.test", a1)
	n := &Names{Resolver: dns.Resolver(), Refresh: time.Hour}
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !n.Resolves(ctx, "svc.test", a1) {
				t.Error("svc.test does not resolve to its address")
			}
		}()
	}
	wg.Wait()
	q := dns.Queries()
	if q == 0 || q > 2 { // one look-up: A and AAAA
		t.Fatalf("20 concurrent requests made %d DNS queries, want one look-up", q)
	}
	// The service moves: within Refresh the old answer stands...
	dns.Set("svc.test", a2)
	if n.Resolves(ctx, "svc.test", a2) || dns.Queries() != q {
		t.Fatalf("an address missing from a fresh answer was looked up again within Refresh (%d queries)", dns.Queries())
	}
	// ...and past it the name is asked again.
	n.Refresh = time.Nanosecond
	if !n.Resolves(ctx, "svc.test", a2) || dns.Queries() == q {
		t.Fatal("a moved service was not looked up again past Refresh")
	}
	if n.Resolves(ctx, "unknown.test", a1) {
		t.Fatal("a name that does not exist proves an address")
	}
	// Bounded: Max names kept.
	b := &Names{Resolver: dns.Resolver(), Max: 3}
	for _, h := range []string{"a.test", "b.test", "c.test", "d.test", "e.test"} {
		b.Resolves(ctx, h, a1)
	}
	b.mu.Lock()
	kept := len(b.m)
	b.mu.Unlock()
	if kept > 3 {
		t.Fatalf("%d names kept, Max 3", kept)
	}
	// A request that gives up waiting is told false; the look-up goes on.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if (&Names{Resolver: dns.Resolver()}).Resolves(cctx, "svc.test", a2) {
		t.Fatal("a cancelled request proved a name")
	}
}
