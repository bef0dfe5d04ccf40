//go:build tools

// Package tools pins the programs test/kubeapi and test/kubenode build:
// etcd, kube-apiserver, and for a real node kubelet,
// kube-controller-manager, kube-scheduler and kube-proxy. Never compiled (the tools
// build tag); it only makes `go mod tidy` keep their dependencies.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
