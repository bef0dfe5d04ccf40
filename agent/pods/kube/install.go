package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Install tells an uninstall from a restart. When the agent is told to
// stop, the pinned eBPF state must stay for the next agent if one comes
// (a rollout, a deleted pod, a killed container: the DaemonSet is still
// there) and must go if none will (the DaemonSet or its namespace is being
// deleted: `kubectl delete -k deploy/kubernetes`, `helm uninstall`).
//
// WatchInstall finds the DaemonSet that owns the agent's pod and watches
// its metadata and its namespace's from then on: by the time the agent
// gets SIGTERM during an uninstall the API may already refuse it (its
// RBAC is deleted with the rest), but the watches opened before still
// deliver. Removed goes by what the watches saw, then asks the API.
//
// It needs get, list and watch on its own DaemonSet and namespace (see
// deploy/kubernetes/rbac.yaml: by name, nothing else).
type Install struct {
	// DaemonSet and Namespace the agent belongs to.
	DaemonSet, Namespace string

	meta   metadata.Interface
	ds, ns cache.SharedIndexInformer
	stop   context.CancelFunc
	done   sync.WaitGroup
}

var (
	daemonSets = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}
	namespaces = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
)

// WatchInstall looks up the agent's own pod (podNamespace/podName, from
// the downward API), the DaemonSet that controls it, and starts watching
// both the DaemonSet and the namespace. Close stops the watches.
func WatchInstall(ctx context.Context, cfg *rest.Config, core rest.Interface, podNamespace, podName string) (*Install, error) {
	if podNamespace == "" || podName == "" {
		return nil, fmt.Errorf("%w: the agent's own pod name and namespace are needed (POD_NAME, POD_NAMESPACE from the downward API)", ErrConfig)
	}
	var pod metav1.PartialObjectMetadata
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body, err := core.Get().Namespace(podNamespace).Resource("pods").Name(podName).DoRaw(gctx)
	if err == nil {
		err = json.Unmarshal(body, &pod)
	}
	if err != nil {
		return nil, fmt.Errorf("kube: the agent's own pod %s/%s: %w", podNamespace, podName, err)
	}
	var ds string
	for _, o := range pod.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
			ds = o.Name
		}
	}
	if ds == "" {
		return nil, fmt.Errorf("%w: the agent's pod %s/%s is not controlled by a DaemonSet", ErrConfig, podNamespace, podName)
	}
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: metadata client: %v", ErrConfig, err)
	}
	i := &Install{DaemonSet: ds, Namespace: podNamespace, meta: mc}
	wctx, stop := context.WithCancel(context.Background())
	i.stop = stop
	i.ds = metaInformer(wctx, mc.Resource(daemonSets).Namespace(podNamespace), ds)
	i.ns = metaInformer(wctx, mc.Resource(namespaces), podNamespace)
	for _, inf := range []cache.SharedIndexInformer{i.ds, i.ns} {
		i.done.Add(1)
		go func() {
			defer i.done.Done()
			inf.RunWithContext(wctx)
		}()
	}
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if !cache.WaitForCacheSync(sctx.Done(), i.ds.HasSynced, i.ns.HasSynced) {
		i.Close()
		return nil, fmt.Errorf("kube: watching the agent's DaemonSet %s/%s and namespace: not synced in 30s", podNamespace, ds)
	}
	return i, nil
}

// metaInformer watches the metadata of the one object called name.
func metaInformer(ctx context.Context, r metadata.ResourceInterface, name string) cache.SharedIndexInformer {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return r.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return r.Watch(ctx, o)
		},
	}
	return cache.NewSharedIndexInformer(lw, &metav1.PartialObjectMetadata{}, 0, cache.Indexers{})
}

// Removed reports whether egret is being uninstalled, and why: its
// namespace or DaemonSet is being deleted or is gone, or the API now
// refuses the agent what its install granted it (its RBAC was deleted).
// The watches are read first, then the API is asked (5 s at most): a
// deletion the watch has not delivered yet is seen there.
func (i *Install) Removed(ctx context.Context) (bool, string) {
	// What the watches saw first: kubectl delete -k deletes the namespace
	// first, and the RBAC soon after, before this agent gets its SIGTERM.
	for _, o := range i.ns.GetStore().List() {
		if o.(*metav1.PartialObjectMetadata).DeletionTimestamp != nil {
			return true, "namespace " + i.Namespace + " is being deleted (watched)"
		}
	}
	if objs := i.ds.GetStore().List(); len(objs) == 0 {
		return true, "DaemonSet " + i.Namespace + "/" + i.DaemonSet + " is gone (watched)"
	} else if objs[0].(*metav1.PartialObjectMetadata).DeletionTimestamp != nil {
		return true, "DaemonSet " + i.Namespace + "/" + i.DaemonSet + " is being deleted (watched)"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ns, nsErr := i.meta.Resource(namespaces).Get(ctx, i.Namespace, metav1.GetOptions{})
	ds, dsErr := i.meta.Resource(daemonSets).Namespace(i.Namespace).Get(ctx, i.DaemonSet, metav1.GetOptions{})
	switch {
	case nsErr == nil && ns.DeletionTimestamp != nil:
		return true, "namespace " + i.Namespace + " is being deleted"
	case apierrors.IsNotFound(nsErr):
		return true, "namespace " + i.Namespace + " is gone"
	case dsErr == nil && ds.DeletionTimestamp != nil:
		return true, "DaemonSet " + i.Namespace + "/" + i.DaemonSet + " is being deleted"
	case apierrors.IsNotFound(dsErr):
		return true, "DaemonSet " + i.Namespace + "/" + i.DaemonSet + " is gone"
	case apierrors.IsForbidden(dsErr) || apierrors.IsUnauthorized(dsErr):
		return true, "the API refuses the agent its DaemonSet now (its RBAC or service account was deleted)"
	case nsErr == nil && dsErr == nil:
		return false, "DaemonSet " + i.Namespace + "/" + i.DaemonSet + " is in place"
	}
	return false, fmt.Sprintf("the API did not answer (%v, %v); the DaemonSet was in place when last watched", dsErr, nsErr)
}

// Close stops the watches.
func (i *Install) Close() {
	i.stop()
	i.done.Wait()
}
