package proxy

import (
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// The tap sees each finished request with its pod, upstream, outcome,
// attempts, reason and status; an observer that does not read misses
// requests (counted) without holding them up; the kept events come back
// newest last, filtered.
func TestTapObserversAndRecent(t *testing.T) {
	var n atomic.Int64
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/flaky" {
			if n.Add(1) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
		}
		io.WriteString(w, "ok")
	})
	tap := NewTap(4)
	src := Source{Namespace: "ns1", Pod: "web", Workload: "deployment/web"}
	p := startProxy(t, Config{Mode: Explicit, Shared: Shared{Tap: tap}, Source: src})
	// A stalled observer (queue of 2, never read) and one the test reads.
	_, stalled := tap.Observe(Filter{}, 0, true, 2)
	defer stalled.Close()
	_, reader := tap.Observe(Filter{Pod: "ns1/web"}, 0, true, 64)
	defer reader.Close()
	_, other := tap.Observe(Filter{Namespace: "ns2"}, 0, true, 64)
	defer other.Close()

	c := p.client()
	ids := []string{}
	get := func(path string) {
		t.Helper()
		resp, err := c.Get(up.url(path))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ids = append(ids, resp.Header.Get(HeaderRequestID))
	}
	get("/flaky")
	for i := range 5 {
		get("/ok" + strconv.Itoa(i))
	}
	var got []Event
	for len(got) < 6 {
		select {
		case e := <-reader.C():
			got = append(got, e)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d events of 6", len(got))
		}
	}
	first := got[0]
	if first.RequestID != ids[0] || first.Outcome != "relayed" || first.Attempts != 2 || first.Reason != "status" ||
		first.Status != 200 || first.Upstream != up.addr || first.Namespace != "ns1" || first.Pod != "web" ||
		first.Workload != "deployment/web" || first.URL != up.url("/flaky") || first.Method != "GET" || first.Duration <= 0 {
		t.Fatalf("the retried request's event: %+v (id %s)", first, ids[0])
	}
	for i, e := range got[1:] {
		// A 200's decision is deny/status: nothing to retry.
		if e.RequestID != ids[i+1] || e.Attempts != 1 || e.Reason != "status" || e.Status != 200 {
			t.Errorf("event %d: %+v, want request %s answered at the first attempt", i+1, e, ids[i+1])
		}
	}
	if d := stalled.Dropped(); d != 4 || len(stalled.C()) != 2 {
		t.Errorf("the stalled observer: %d dropped, %d queued; want 4 and 2", d, len(stalled.C()))
	}
	if len(other.C()) != 0 || other.Dropped() != 0 {
		t.Errorf("an observer of another namespace got %d events", len(other.C()))
	}
	// Recent: the ring keeps 4, newest last; filters apply.
	recent := tap.Recent(Filter{}, 10)
	if len(recent) != 4 || recent[0].RequestID != ids[2] || recent[3].RequestID != ids[5] {
		t.Fatalf("recent: %d events, first %v; want the last 4 requests, oldest first", len(recent), recent)
	}
	if r := tap.Recent(Filter{}, 2); len(r) != 2 || r[1].RequestID != ids[5] || r[0].RequestID != ids[4] {
		t.Errorf("recent 2: %+v", r)
	}
	if r := tap.Recent(Filter{Outcome: "ambiguous"}, 10); len(r) != 0 {
		t.Errorf("recent ambiguous: %+v", r)
	}
	// Observe with last and follow: the past, then what comes, with no
	// gap between.
	past, o := tap.Observe(Filter{Upstream: up.addr}, 3, true, 8)
	defer o.Close()
	if len(past) != 3 || past[2].RequestID != ids[5] {
		t.Fatalf("past: %+v", past)
	}
	get("/after")
	select {
	case e := <-o.C():
		if e.RequestID != ids[6] {
			t.Fatalf("followed %s, want %s", e.RequestID, ids[6])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event after Observe")
	}
	o.Close()
	if _, ok := <-o.C(); ok {
		t.Fatal("C not closed by Close")
	}
}
