//go:build tools

// Package tools pins the crane command that deploy/image/imagebuild's
// push test builds. Never compiled (the tools build tag); it only makes
// `go mod tidy` keep its dependencies.
package tools

import (
	_ "github.com/google/go-containerregistry/cmd/crane"
)
