//go:build !race

package bpfload_test

const raceEnabled = false
