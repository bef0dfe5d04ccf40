package bpfload

import (
	"errors"
	"fmt"
)

// Sentinel errors; match them with errors.Is.
var (
	// ErrNotRoot: loading and attaching eBPF programs needs root
	// (CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN for cgroup attach).
	ErrNotRoot = errors.New("bpfload: needs root (euid 0)")
	// ErrFeature: the running kernel lacks something egret needs. The
	// concrete error is a *FeatureError naming it.
	ErrFeature = errors.New("bpfload: kernel feature missing")
)

// FeatureError names the missing kernel feature. It matches ErrFeature.
type FeatureError struct {
	Feature string // e.g. "BPF_PROG_TYPE_CGROUP_SOCKOPT"
	Need    string // what egret uses it for
	Err     error  // the underlying error, if any
}

func (e *FeatureError) Error() string {
	s := fmt.Sprintf("kernel feature missing: %s (needed for %s)", e.Feature, e.Need)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is makes errors.Is(err, ErrFeature) true.
func (e *FeatureError) Is(target error) bool { return target == ErrFeature }

// Unwrap returns the underlying error.
func (e *FeatureError) Unwrap() error { return e.Err }
