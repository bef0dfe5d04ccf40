package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCounterSum(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"a", "b"})
	reg.MustRegister(c)
	c.WithLabelValues("1", "p").Add(2)
	c.WithLabelValues("1", "q").Add(3)
	c.WithLabelValues("2", "p").Add(5)
	for _, tc := range []struct {
		labels []string
		want   float64
	}{
		{nil, 10},
		{[]string{"a", "1"}, 5},
		{[]string{"b", "p"}, 7},
		{[]string{"a", "2", "b", "p"}, 5},
		{[]string{"a", "2", "b", "q"}, 0},
		{[]string{"c", ""}, 0},
	} {
		if got := CounterSum(t, reg, "x_total", tc.labels...); got != tc.want {
			t.Errorf("CounterSum(%q) = %v, want %v", tc.labels, got, tc.want)
		}
	}
	if got := CounterSum(t, reg, "y_total"); got != 0 {
		t.Errorf("absent family: %v", got)
	}
}
