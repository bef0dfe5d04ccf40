package retry

import (
	"bytes"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/egret-proxy/egret/engine"
)

// TestMetricsCacheCountsAsTheVectors: the children Metrics caches count
// what lookups in the vectors would, label for label, for every category,
// decision, reason and outcome, each seen more than once.
func TestMetricsCacheCountsAsTheVectors(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ref := prometheus.NewRegistry()
	want, err := NewMetrics(ref) // fed through the vectors only
	if err != nil {
		t.Fatal(err)
	}
	cats := append([]engine.Category{engine.CategoryNone}, engine.Categories()...)
	reasons := []engine.Reason{engine.ReasonNone, engine.ReasonMaxAttempts, engine.ReasonStatus, engine.ReasonRetryAfter,
		engine.ReasonNotSent, engine.Reason(cacheSlots + 1)} // the last one is not cached
	outcomes := append(cachedOutcomes[:], "something-else")
	for round := range 3 {
		for i, c := range cats {
			for _, d := range []engine.Decision{engine.Deny, engine.Retry, engine.Ambiguous} {
				for _, r := range reasons[:1+(i+round)%len(reasons)] {
					a := &Attempt{Failure: c, Decision: engine.Result{Decision: d, Reason: r}}
					m.attempt(a)
					want.attempts.WithLabelValues(c.String()).Inc()
					want.decisions.WithLabelValues(d.String(), r.String()).Inc()
				}
			}
		}
		for _, o := range outcomes[:1+round%len(outcomes)] {
			m.outcome(o)
			want.outcomes.WithLabelValues(o).Inc()
		}
		for _, o := range outcomes {
			m.outcome(o)
			want.outcomes.WithLabelValues(o).Inc()
		}
	}
	if got, exp := exposition(t, reg), exposition(t, ref); got != exp {
		t.Fatalf("cached counts differ from the vectors'.\ngot:\n%s\nwant:\n%s", got, exp)
	}
}

func exposition(t *testing.T, g prometheus.Gatherer) string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}
