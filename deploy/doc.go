// Package deploy holds what people install and watch: the Kubernetes
// manifests (kubernetes/, with optional kustomize components under
// kubernetes/components/), the same as a Helm chart (helm/egret), the
// image's Containerfile and its registry-less builder (image/), the node
// dashboard (dashboards/) and the Prometheus rules and scrape job
// (prometheus/). It has no code; its tests hold those files to the
// binary, the policy package and the metrics egret really registers, hold
// the chart and the components to the kustomize base, and apply the
// manifests to a real kube-apiserver.
package deploy

// The rules and the dashboard, copied where the components and the chart
// can read them (deploy/copies).
//go:generate go run ./copies
