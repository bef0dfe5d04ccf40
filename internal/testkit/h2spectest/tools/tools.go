//go:build tools

// Package tools pins the h2spec command that internal/testkit/h2spectest
// builds. Never compiled (the tools build tag); it only makes `go mod tidy`
// keep its dependencies.
package tools

import (
	_ "github.com/summerwind/h2spec/cmd/h2spec"
)
