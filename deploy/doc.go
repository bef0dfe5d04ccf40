// Package deploy holds what people install and watch: the Kubernetes
// manifests (kubernetes/), the image's Containerfile, the node dashboard
// (dashboards/) and the Prometheus rules and scrape job (prometheus/). It
// has no code; its tests hold those files to the binary, the policy package
// and the metrics egret really registers, and apply the manifests to a real
// kube-apiserver.
package deploy
