package kube_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/egret-proxy/egret/agent/pods/kube"
)

func TestMeshSidecar(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	app := corev1.Container{Name: "app"}
	for _, tc := range []struct {
		name  string
		annot map[string]string
		init  []corev1.Container
		ctrs  []corev1.Container
		want  string
	}{
		{name: "plain", ctrs: []corev1.Container{app}, want: ""},
		{name: "istio annotation", annot: map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`}, ctrs: []corev1.Container{app}, want: "Istio (annotation sidecar.istio.io/status)"},
		{name: "istio inject asked, not injected", annot: map[string]string{"sidecar.istio.io/inject": "true"}, ctrs: []corev1.Container{app}, want: ""},
		{name: "ambient", annot: map[string]string{"ambient.istio.io/redirection": "enabled"}, ctrs: []corev1.Container{app}, want: "Istio ambient (annotation ambient.istio.io/redirection)"},
		{name: "ambient disabled", annot: map[string]string{"ambient.istio.io/redirection": "disabled"}, ctrs: []corev1.Container{app}, want: ""},
		{name: "linkerd annotation", annot: map[string]string{"linkerd.io/proxy-version": "edge-25.1.1"}, ctrs: []corev1.Container{app}, want: "Linkerd (annotation linkerd.io/proxy-version)"},
		{name: "istio container", ctrs: []corev1.Container{app, {Name: "istio-proxy"}}, want: "Istio (container istio-proxy)"},
		{name: "linkerd native sidecar", init: []corev1.Container{{Name: "linkerd-init"}, {Name: "linkerd-proxy", RestartPolicy: &always}}, ctrs: []corev1.Container{app},
			want: "Linkerd (sidecar container linkerd-proxy)"},
		{name: "istio native sidecar", init: []corev1.Container{{Name: "istio-proxy", RestartPolicy: &always}}, ctrs: []corev1.Container{app}, want: "Istio (sidecar container istio-proxy)"},
		{name: "linkerd cni validator", init: []corev1.Container{{Name: "linkerd-network-validator"}}, ctrs: []corev1.Container{app}, want: "Linkerd (init container linkerd-network-validator)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Annotations: tc.annot},
				Spec: corev1.PodSpec{InitContainers: tc.init, Containers: tc.ctrs}}
			if got := kube.MeshSidecar(p); got != tc.want {
				t.Fatalf("MeshSidecar = %q, want %q", got, tc.want)
			}
		})
	}
}
