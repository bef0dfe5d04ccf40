//go:build tools

// Package tools pins the programs test/kubeapi builds: kube-apiserver and
// etcd. Never compiled (the tools build tag); it only makes `go mod tidy`
// keep their dependencies.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
