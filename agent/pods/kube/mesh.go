package kube

import (
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// ErrMeshSidecar: a pod that opted in has a service mesh's sidecar (Istio,
// Linkerd) or is redirected by a mesh in its own network namespace (Istio
// ambient). egret leaves it out: see MeshSidecar and deploy/README.md,
// "Beside a service mesh or an eBPF CNI".
var ErrMeshSidecar = errors.New("kube: the pod has a service mesh sidecar; egret leaves it to the mesh")

// ReasonMeshSidecar is the reason of the Warning Event on an opted-in pod
// egret leaves to its mesh.
const ReasonMeshSidecar = "EgretMeshSidecar"

// Annotations and container names by which meshes mark the pods they
// redirect. Each is set by the mesh's injector (or CNI), never by hand.
var (
	// meshAnnotations: Istio's sidecar injector (sidecar.istio.io/status),
	// Istio ambient's CNI (ambient.istio.io/redirection: enabled, its
	// iptables in the pod's namespace send traffic to ztunnel), Linkerd's
	// proxy injector (linkerd.io/proxy-version).
	meshAnnotations = []struct{ key, value, mesh string }{
		{"sidecar.istio.io/status", "", "Istio"},
		{"ambient.istio.io/redirection", "enabled", "Istio ambient"},
		{"linkerd.io/proxy-version", "", "Linkerd"},
	}
	// meshContainers: the proxies (a container, or a native sidecar: an
	// init container with restartPolicy Always) and the init containers
	// that install the iptables redirect.
	meshContainers = []struct{ name, mesh string }{
		{"istio-proxy", "Istio"},
		{"istio-init", "Istio"},
		{"istio-validation", "Istio"},
		{"linkerd-proxy", "Linkerd"},
		{"linkerd-init", "Linkerd"},
		{"linkerd-network-validator", "Linkerd"},
	}
)

// MeshSidecar says what marks the pod as a service mesh's ("Istio
// (annotation sidecar.istio.io/status)", "Linkerd (container
// linkerd-proxy)"), or "" for none.
//
// Such a pod's network namespace has the mesh's iptables rules: every
// outbound TCP connection but the sidecar's own (its uid) is sent to the
// sidecar's port (Istio, Linkerd: nat OUTPUT, REDIRECT), and the sidecar
// retries on its own (Istio by default: 2 retries on 503 and
// connect-failure, whatever the method). egret's connect hook runs at
// connect(), before netfilter sees the SYN: put behind egret, the pod's
// requests would reach egret first, and egret's own connections upstream,
// dialed from the pod's namespace by a process that is not the sidecar's
// uid, would be redirected to the sidecar — two retry layers, each blind to
// the other's attempts, so one request may run up to 3 × 3 times and
// egret's evidence (it saw its connection to the sidecar, not the
// upstream's) says nothing of what ran. And egret's default listener port,
// 15001, is Istio's outbound port. The pod is left to the mesh.
func MeshSidecar(pod *corev1.Pod) string {
	for _, a := range meshAnnotations {
		if v, ok := pod.Annotations[a.key]; ok && (a.value == "" || v == a.value) {
			return fmt.Sprintf("%s (annotation %s)", a.mesh, a.key)
		}
	}
	for _, c := range meshContainers {
		named := func(x corev1.Container) bool { return x.Name == c.name }
		if slices.ContainsFunc(pod.Spec.Containers, named) {
			return fmt.Sprintf("%s (container %s)", c.mesh, c.name)
		}
		if i := slices.IndexFunc(pod.Spec.InitContainers, named); i >= 0 {
			kind := "init container"
			if rp := pod.Spec.InitContainers[i].RestartPolicy; rp != nil && *rp == corev1.ContainerRestartPolicyAlways {
				kind = "sidecar container"
			}
			return fmt.Sprintf("%s (%s %s)", c.mesh, kind, c.name)
		}
	}
	return ""
}
