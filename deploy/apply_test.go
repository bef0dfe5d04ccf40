package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/agent/pods/kube"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/test/kubeapi"
)

// create sends one manifest object to the API server with strict
// server-side field validation, and returns what the server stored.
func create(ctx context.Context, c kubernetes.Interface, obj runtime.Object) (runtime.Object, error) {
	opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	switch o := obj.(type) {
	case *corev1.Namespace:
		return c.CoreV1().Namespaces().Create(ctx, o, opts)
	case *corev1.ServiceAccount:
		return c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
	case *corev1.ConfigMap:
		return c.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, opts)
	case *rbacv1.ClusterRole:
		return c.RbacV1().ClusterRoles().Create(ctx, o, opts)
	case *rbacv1.ClusterRoleBinding:
		return c.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
	case *rbacv1.Role:
		return c.RbacV1().Roles(o.Namespace).Create(ctx, o, opts)
	case *rbacv1.RoleBinding:
		return c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, opts)
	case *appsv1.DaemonSet:
		return c.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, opts)
	case *networkingv1.NetworkPolicy:
		return c.NetworkingV1().NetworkPolicies(o.Namespace).Create(ctx, o, opts)
	}
	return nil, fmt.Errorf("no client for %T", obj)
}

// get reads an object back by its kind, namespace and name.
func get(ctx context.Context, c kubernetes.Interface, obj runtime.Object) (runtime.Object, error) {
	m, err := metaOf(obj)
	if err != nil {
		return nil, err
	}
	ns, name, opts := m.GetNamespace(), m.GetName(), metav1.GetOptions{}
	switch obj.(type) {
	case *corev1.Namespace:
		return c.CoreV1().Namespaces().Get(ctx, name, opts)
	case *corev1.ServiceAccount:
		return c.CoreV1().ServiceAccounts(ns).Get(ctx, name, opts)
	case *corev1.ConfigMap:
		return c.CoreV1().ConfigMaps(ns).Get(ctx, name, opts)
	case *rbacv1.ClusterRole:
		return c.RbacV1().ClusterRoles().Get(ctx, name, opts)
	case *rbacv1.ClusterRoleBinding:
		return c.RbacV1().ClusterRoleBindings().Get(ctx, name, opts)
	case *rbacv1.Role:
		return c.RbacV1().Roles(ns).Get(ctx, name, opts)
	case *rbacv1.RoleBinding:
		return c.RbacV1().RoleBindings(ns).Get(ctx, name, opts)
	case *appsv1.DaemonSet:
		return c.AppsV1().DaemonSets(ns).Get(ctx, name, opts)
	case *networkingv1.NetworkPolicy:
		return c.NetworkingV1().NetworkPolicies(ns).Get(ctx, name, opts)
	}
	return nil, fmt.Errorf("no client for %T", obj)
}

// storedAsWritten returns the fields of sent that got lacks or holds with
// another value: the server may add defaults, never drop or change what
// the manifest says.
func storedAsWritten(sent, got runtime.Object) ([]string, error) {
	var s, g any
	for _, x := range []struct {
		obj runtime.Object
		out *any
	}{{sent, &s}, {got, &g}} {
		b, err := json.Marshal(x.obj)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, x.out); err != nil {
			return nil, err
		}
	}
	var diffs []string
	subset(s, g, "", &diffs)
	return diffs, nil
}

func subset(s, g any, at string, diffs *[]string) {
	switch sv := s.(type) {
	case nil:
	case map[string]any:
		gv, ok := g.(map[string]any)
		if !ok {
			*diffs = append(*diffs, fmt.Sprintf("%s: stored %v", at, g))
			return
		}
		for k, v := range sv {
			if at == "" && (k == "apiVersion" || k == "kind") {
				continue // typed clients drop the TypeMeta of what they read
			}
			subset(v, gv[k], at+"."+k, diffs)
		}
	case []any:
		gv, ok := g.([]any)
		if !ok || len(gv) != len(sv) {
			*diffs = append(*diffs, fmt.Sprintf("%s: sent %d items, stored %v", at, len(sv), g))
			return
		}
		for i := range sv {
			subset(sv[i], gv[i], fmt.Sprintf("%s[%d]", at, i), diffs)
		}
	default:
		if !reflect.DeepEqual(s, g) {
			*diffs = append(*diffs, fmt.Sprintf("%s: sent %v, stored %v", at, s, g))
		}
	}
}

func TestStoredAsWrittenSeesAChange(t *testing.T) {
	a := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"x": "1"}}, Data: map[string]string{"k": "v"}}
	b := a.DeepCopy()
	b.Annotations = map[string]string{"added": "by the server"}
	if d, err := storedAsWritten(a, b); err != nil || len(d) != 0 {
		t.Errorf("an addition: %q %v", d, err)
	}
	b.Data["k"] = "w"
	delete(b.Labels, "x")
	if d, _ := storedAsWritten(a, b); len(d) != 2 {
		t.Errorf("a change and a loss: %q", d)
	}
}

// TestApplyToAPIServer creates every manifest on a real kube-apiserver (RBAC
// on, strict field validation), reads each back as written, and then holds
// the agent's service account to its role: the real Kubernetes pod source,
// running as that account, lists and watches its node's pods and records
// Warning Events (and counts a repeat by patching it), and the account can
// do nothing else.
func TestApplyToAPIServer(t *testing.T) {
	c := kubeapi.StartWith(t, kubeapi.Options{RBAC: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	objs := loadManifests(t)
	for _, o := range objs {
		stored, err := create(ctx, c.Client, o.obj.DeepCopyObject())
		if err != nil {
			t.Fatalf("%s: create %T: %v", o.file, o.obj, err)
		}
		back, err := get(ctx, c.Client, o.obj)
		if err != nil {
			t.Fatalf("%s: read back: %v", o.file, err)
		}
		if back.(metav1.Object).GetUID() != stored.(metav1.Object).GetUID() {
			t.Errorf("%s: read back another object", o.file)
		}
		diffs, err := storedAsWritten(o.obj, back)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range diffs {
			t.Errorf("%s: %s", o.file, d)
		}
	}
	ds := only[*appsv1.DaemonSet](t, objs)
	got, err := c.Client.AppsV1().DaemonSets(ds.Namespace).Get(ctx, ds.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Generation != 1 || got.Spec.Template.Spec.Containers[0].Image != ds.Spec.Template.Spec.Containers[0].Image {
		t.Errorf("DaemonSet stored as generation %d with image %s", got.Generation, got.Spec.Template.Spec.Containers[0].Image)
	}
	// The server's validation is the real thing: a Bidirectional mount in
	// a container that is not privileged is refused, so the accepted
	// DaemonSet above was validated, not just stored.
	bad := ds.DeepCopy()
	bad.Name = "egret-unprivileged"
	bad.Spec.Template.Spec.Containers[0].SecurityContext.Privileged = nil
	if _, err := create(ctx, c.Client, bad); !apierrors.IsInvalid(err) {
		t.Errorf("an unprivileged DaemonSet with a Bidirectional mount: %v, want Invalid", err)
	}

	// The agent's identity, held to its ClusterRole.
	sa := only[*corev1.ServiceAccount](t, objs)
	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	agentCfg := c.ConfigAs(user, "system:serviceaccounts", "system:serviceaccounts:"+sa.Namespace, "system:authenticated")
	agentClient := kubernetes.NewForConfigOrDie(agentCfg)
	agentCore, err := kube.NewClient(agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	checkSourceRuns(ctx, t, c.Client, agentCore, c.Namespace(t))
	checkNothingMore(ctx, t, agentClient, sa.Namespace)
	checkInstallWatch(ctx, t, c.Client, agentCfg, agentCore, ds)
}

// checkInstallWatch runs kube.WatchInstall as the agent, for an agent pod
// the DaemonSet controls (made by hand: no controller runs here): with
// the DaemonSet in place a stop is a restart; once it is deleted, an
// uninstall.
func checkInstallWatch(ctx context.Context, t *testing.T, admin kubernetes.Interface, agentCfg *rest.Config, agentCore rest.Interface, ds *appsv1.DaemonSet) {
	t.Helper()
	stored, err := admin.AppsV1().DaemonSets(ds.Namespace).Get(ctx, ds.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "egret-agent-x", Namespace: ds.Namespace, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: stored.UID, Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "agent", Image: "example.invalid/egret"}}},
	}
	if _, err := admin.CoreV1().Pods(ds.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	inst, err := kube.WatchInstall(ctx, agentCfg, agentCore, ds.Namespace, pod.Name)
	if err != nil {
		t.Fatalf("WatchInstall as the agent: %v", err)
	}
	defer inst.Close()
	if inst.DaemonSet != ds.Name {
		t.Errorf("WatchInstall found DaemonSet %q", inst.DaemonSet)
	}
	if removed, why := inst.Removed(ctx); removed {
		t.Errorf("DaemonSet in place: Removed = true (%s)", why)
	}
	if err := admin.AppsV1().DaemonSets(ds.Namespace).Delete(ctx, ds.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if removed, why := inst.Removed(ctx); !removed || !strings.Contains(why, "gone") {
		t.Errorf("DaemonSet deleted: Removed = %v (%s)", removed, why)
	}
}

// checkSourceRuns runs egret's Kubernetes pod source as the agent: a pod
// on its node with a bad annotation must be reported and given a Warning
// Event, once listed and again once watched.
func checkSourceRuns(ctx context.Context, t *testing.T, admin kubernetes.Interface, agentClient rest.Interface, ns string) {
	t.Helper()
	const node = "node-a"
	var mu sync.Mutex
	var reported []error
	rec, stopRec := kube.NewRecorder(agentClient, node)
	defer stopRec()
	src, err := kube.New(kube.Config{
		Client: agentClient, NodeName: node, CgroupRoot: t.TempDir(), NetnsDirs: []string{},
		Recorder: rec,
		OnError:  func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	badPod := func(name string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{
				"egret.dev/enabled": "true", "egret.dev/listen-port": "http"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
		}
		created, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.Phase = corev1.PodRunning
		if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return created
	}
	listed := badPod("listed")

	runCtx, stop := context.WithCancel(ctx)
	events := make(chan pods.Event, 16)
	done := make(chan error, 1)
	go func() { done <- src.Run(runCtx, events) }()
	defer func() { stop(); <-done }()
	waitEvent := func(kind pods.EventKind) {
		select {
		case ev := <-events:
			if ev.Kind != kind {
				t.Fatalf("source sent %v, want %v", ev.Kind, kind)
			}
		case err := <-done:
			t.Fatalf("source ended: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatalf("no %v from the source (can the agent list pods?)", kind)
		}
	}
	waitEvent(pods.Synced) // listed: the pod with a bad annotation is left out
	watched := badPod("watched")

	eventsOn := func(p *corev1.Pod) []corev1.Event {
		l, err := admin.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(p.UID)})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	// Polls the API server for the agent's Events.
	var lev, wev []corev1.Event
	if !testenv.Poll(30*time.Second, func() bool {
		lev, wev = eventsOn(listed), eventsOn(watched)
		return len(lev) == 1 && len(wev) == 1
	}) {
		mu.Lock()
		t.Fatalf("Warning Events: listed pod %d, watched pod %d, want 1 each (can the agent watch pods and create events?); reported %v", len(lev), len(wev), reported)
	}
	for _, e := range append(lev, wev...) {
		if e.Type != corev1.EventTypeWarning || e.Reason != kube.ReasonBadAnnotation || e.Source.Component != kube.Component {
			t.Errorf("event %s %s from %s: %s", e.Type, e.Reason, e.Source.Component, e.Message)
		}
	}
	mu.Lock()
	n := len(reported)
	for _, err := range reported {
		if !errors.Is(err, kube.ErrAnnotation) {
			t.Errorf("source reported %v, want only the bad annotations (a forbidden list or watch shows up here)", err)
		}
	}
	mu.Unlock()
	if n != 2 {
		t.Errorf("source reported %d errors, want 2", n)
	}

	// A repeat of an Event is counted on the one already there: the
	// recorder patches it, which the role must allow.
	first := eventsOn(listed)[0]
	rec.Event(listed, corev1.EventTypeWarning, first.Reason, first.Message)
	// Polls the API server for the Event's count.
	var evs []corev1.Event
	if !testenv.Poll(30*time.Second, func() bool { evs = eventsOn(listed); return len(evs) == 1 && evs[0].Count == 2 }) {
		t.Fatalf("the repeated Event was not counted (can the agent patch events?): %+v", evs)
	}
}

// checkNothingMore: the agent can change no pod and read nothing else.
func checkNothingMore(ctx context.Context, t *testing.T, c kubernetes.Interface, ns string) {
	t.Helper()
	for what, call := range map[string]func() error{
		"list secrets": func() error { _, err := c.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); return err },
		"create secret": func() error {
			_, err := c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		},
		"get configmap": func() error {
			_, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "egret-policy", metav1.GetOptions{})
			return err
		},
		"list nodes": func() error { _, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err },
		"create pod": func() error {
			_, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "c"}}}}, metav1.CreateOptions{})
			return err
		},
		"patch pod": func() error {
			_, err := c.CoreV1().Pods(ns).Patch(ctx, "x", types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{})
			return err
		},
		"delete events": func() error {
			return c.CoreV1().Events(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		},
		"list events": func() error { _, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); return err },
		"get another namespace": func() error {
			_, err := c.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
			return err
		},
		"list namespaces": func() error { _, err := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); return err },
		"list daemonsets": func() error { _, err := c.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{}); return err },
		"get another daemonset": func() error {
			_, err := c.AppsV1().DaemonSets(ns).Get(ctx, "other", metav1.GetOptions{})
			return err
		},
		"update daemonset": func() error {
			_, err := c.AppsV1().DaemonSets(ns).Update(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "egret"}}, metav1.UpdateOptions{})
			return err
		},
	} {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("agent may %s: %v, want Forbidden", what, err)
		} else if !strings.Contains(err.Error(), "system:serviceaccount:") {
			t.Errorf("%s: forbidden to someone else: %v", what, err)
		}
	}
}
