// Package promreg registers a unit's collectors with the Registerer it was
// given, the one way every egret unit does it.
package promreg

import "github.com/prometheus/client_golang/prometheus"

// Register registers cs with reg in order and stops at the first error. A
// nil reg registers nothing: the unit counts for itself alone.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
