//go:build tools

// Package tools pins the helm command that test/helm builds. Never
// compiled (the tools build tag); it only makes `go mod tidy` keep its
// dependencies.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
