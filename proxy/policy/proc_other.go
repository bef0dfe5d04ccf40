//go:build !unix

package policy

import "os/exec"

// killGroup: without process groups, cancellation kills the command only.
func killGroup(*exec.Cmd) {}
