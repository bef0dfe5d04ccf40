package truth

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/egret-proxy/egret/test/ledger"
)

// The outage policy: the spec's budget ratio with a short ttl so that a few
// seconds of traffic span several windows.
const (
	outageRatio  = 0.2
	outageFloor  = 10 // min_per_second
	outageTTL    = time.Second
	outageLength = 3 * time.Second
	// margin: how far the ledger's timestamps may trail egret's decisions
	// (the backoff, at most 5 ms, and the loopback hop on a busy machine).
	margin = 100 * time.Millisecond
)

const outageDefaults = `
max_attempts: 3
timeout: 2s
attempt_timeout: 500ms
min_attempt: 10ms
backoff:
  kind: full
  base: 1ms
  max: 5ms
budget:
  ratio: 0.2
  min_per_second: 10
  ttl: 1s
protocol: http1
`

// TestOutage: an upstream that answers 503 to everything. Idempotent GETs
// would be retried up to max_attempts each; the node-wide budget must hold
// retries to ratio * originals + min_per_second * ttl over any ttl window
// (spec section 5).
func TestOutage(t *testing.T) {
	u := startUpstreams(t)
	egret, _ := startEgret(t, u.policyFor(outageDefaults))
	const workers = 16
	c := client(egret, workers)
	var (
		mu       sync.Mutex
		ids      []string
		statuses = map[int]int{}
		attempts = map[int]int{}
	)
	stop := time.Now().Add(outageLength)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100000 && time.Now().Before(stop); i++ {
				id := fmt.Sprintf("o%02d-%06d", w, i)
				req, _ := http.NewRequest("GET", "http://"+u.h1.String()+"/outage", nil)
				req.Header.Set(ledger.HeaderID, id)
				req.Header.Set(ledger.HeaderFault, "503")
				a := do(c, req)
				mu.Lock()
				ids = append(ids, id)
				statuses[a.status]++
				attempts[a.attempts]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	// Every upstream request as the ledger saw it: the first execution of an
	// id is its original, the others are retries.
	type event struct {
		at    time.Time
		retry bool
	}
	var events []event
	records := u.ledger.Records()
	for _, id := range ids {
		for i, e := range records[id].Executions {
			events = append(events, event{e.At, i > 0})
		}
	}
	sort.Slice(events, func(i, j int) bool { return events[i].at.Before(events[j].at) })
	originals := len(ids)
	upstream := len(events)
	retries := upstream - originals
	if originals == 0 || upstream == 0 {
		t.Fatal("no traffic")
	}
	span := events[len(events)-1].at.Sub(events[0].at)
	// Windows of ttl that cover the run, with room for the ledger's clock
	// trailing the proxy's decisions (see margin below).
	windows := int((span+margin)/outageTTL) + 1
	bound := outageRatio*float64(originals) + outageFloor*outageTTL.Seconds()*float64(windows)
	ratio := float64(upstream) / float64(originals)
	t.Logf("outage: %d original GETs in %v, %d upstream requests, %d retries: upstream/original = %.3f (budget bound %.3f = 1 + %.1f + %d*%d/%d); answers %v; Egret-Attempts %v",
		originals, span.Round(time.Millisecond), upstream, retries, ratio,
		1+bound/float64(originals), outageRatio, outageFloor, windows, originals, statuses, attempts)
	if got := statuses[503]; got != originals {
		t.Errorf("%d of %d answers were the upstream's 503", got, originals)
	}
	if float64(retries) > bound {
		t.Errorf("retries %d exceed the budget bound %.1f over %d windows of %v", retries, bound, windows, outageTTL)
	}
	// Without retries the bound would hold trivially: the budget must have
	// been used.
	if retries < originals/20 {
		t.Errorf("only %d retries for %d originals: the outage did not exercise the budget", retries, originals)
	}

	// Every window of ttl that starts at a retry. Ledger times trail the
	// proxy's decisions by the backoff and the loopback hop, so originals
	// are counted with a margin either side.
	worst := 0.0
	for i, e := range events {
		if !e.retry {
			continue
		}
		end := e.at.Add(outageTTL)
		var r, o int
		for _, x := range events[i:] {
			if !x.at.Before(end) {
				break
			}
			if x.retry {
				r++
			}
		}
		lo := sort.Search(len(events), func(k int) bool { return !events[k].at.Before(e.at.Add(-margin)) })
		for _, x := range events[lo:] {
			if !x.at.Before(end.Add(margin)) {
				break
			}
			if !x.retry {
				o++
			}
		}
		limit := outageRatio*float64(o) + outageFloor*outageTTL.Seconds()
		if float64(r)/limit > worst {
			worst = float64(r) / limit
		}
		if float64(r) > limit {
			t.Errorf("window from %v: %d retries > %.1f (%d originals)", e.at.Format("15:04:05.000"), r, limit, o)
			break
		}
	}
	t.Logf("outage: the fullest ttl window used %.0f%% of its budget", 100*worst)
}
