package retry

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/client"
)

// sleeps records the waits of a Transport instead of sleeping.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) all() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// lockedRand makes a seeded generator safe for the Transport.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) Int64N(n int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Int64N(n)
}

// testTransport returns a Transport with recorded waits, a seeded jitter,
// a fresh pool and the given policy changes.
func testTransport(t *testing.T, edit func(*Policy)) (*Transport, *sleeps, *[]*Trace) {
	t.Helper()
	base := client.NewHTTPTransport(client.HTTPOptions{})
	t.Cleanup(base.CloseIdleConnections)
	s := &sleeps{}
	var mu sync.Mutex
	traces := &[]*Trace{}
	tr := &Transport{
		Base: base,
		Policy: func(r *http.Request) Policy {
			p := DefaultPolicy("")
			p.Backoff = engine.Backoff{Kind: engine.FullJitter, Base: time.Millisecond, Max: 2 * time.Second}
			if edit != nil {
				edit(&p)
			}
			return p
		},
		Rand:  &lockedRand{r: rand.New(rand.NewPCG(1, 2))},
		Sleep: s.sleep,
		OnTrace: func(tc *Trace) {
			mu.Lock()
			*traces = append(*traces, tc)
			mu.Unlock()
		},
	}
	return tr, s, traces
}
