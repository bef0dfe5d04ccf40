package services

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// scheme knows core/v1 and discovery/v1 only (no clientset: see
// agent/pods/kube's client.go for why).
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	metav1.AddToGroupVersion(s, corev1.SchemeGroupVersion)
	metav1.AddToGroupVersion(s, discoveryv1.SchemeGroupVersion)
	return s
}()

// Clients are the two API clients Run reads through: core/v1 (Services)
// and discovery.k8s.io/v1 (EndpointSlices).
type Clients struct {
	Core, Discovery rest.Interface
}

// NewClients makes the clients from cfg (which is not changed).
func NewClients(cfg *rest.Config) (Clients, error) {
	mk := func(gv schema.GroupVersion, api string) (rest.Interface, error) {
		c := rest.CopyConfig(cfg)
		c.GroupVersion = &gv
		c.APIPath = api
		c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
		if c.ContentType == "" {
			c.ContentType = runtime.ContentTypeJSON
		}
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		return rest.RESTClientFor(c)
	}
	core, err := mk(corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return Clients{}, fmt.Errorf("services: core/v1 client: %w", err)
	}
	disc, err := mk(discoveryv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return Clients{}, fmt.Errorf("services: discovery/v1 client: %w", err)
	}
	return Clients{Core: core, Discovery: disc}, nil
}

// Watcher feeds a Table from the cluster: one informer for Services and
// one for EndpointSlices, for the whole node (never one per pod).
type Watcher struct {
	t   *Table
	c   Clients
	svc cache.SharedIndexInformer
	eps cache.SharedIndexInformer
}

// NewWatcher returns a Watcher of c into t.
func NewWatcher(t *Table, c Clients) *Watcher {
	return &Watcher{t: t, c: c}
}

// Synced reports whether both informers have listed once: until then the
// table holds what has come, and requests to a Service it lacks go through
// the ClusterIP as the pod sent them.
func (w *Watcher) Synced() bool {
	return w.svc != nil && w.eps != nil && w.svc.HasSynced() && w.eps.HasSynced()
}

// Run watches until ctx ends. An apiserver that cannot be reached is
// tried again by the informers; the table stays as it is meanwhile.
func (w *Watcher) Run(ctx context.Context) error {
	w.svc = cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(w.c.Core, "services", metav1.NamespaceAll, fields.Everything()),
		&corev1.Service{}, 0, cache.Indexers{})
	w.eps = cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(w.c.Discovery, "endpointslices", metav1.NamespaceAll, fields.Everything()),
		&discoveryv1.EndpointSlice{}, 0, cache.Indexers{})
	// Only what the table reads is kept in the informers' stores: a
	// slice's endpoints lose their references, names and zones.
	if err := w.svc.SetTransform(trimService); err != nil {
		return err
	}
	if err := w.eps.SetTransform(trimSlice); err != nil {
		return err
	}
	if _, err := w.svc.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.service(o, false) },
		UpdateFunc: func(_, o any) { w.service(o, false) },
		DeleteFunc: func(o any) { w.service(o, true) },
	}); err != nil {
		return err
	}
	if _, err := w.eps.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.slice(o, false) },
		UpdateFunc: func(_, o any) { w.slice(o, false) },
		DeleteFunc: func(o any) { w.slice(o, true) },
	}); err != nil {
		return err
	}
	done := make(chan struct{}, 2)
	go func() { w.svc.Run(ctx.Done()); done <- struct{}{} }()
	go func() { w.eps.Run(ctx.Done()); done <- struct{}{} }()
	<-done
	<-done
	return ctx.Err()
}

func unwrap(o any) any {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return o
}

func (w *Watcher) service(o any, deleted bool) {
	s, ok := unwrap(o).(*corev1.Service)
	if !ok {
		return
	}
	spec := SpecOf(s)
	if deleted {
		spec.ClusterIPs = nil
	}
	w.t.ApplyService(spec)
}

func (w *Watcher) slice(o any, deleted bool) {
	es, ok := unwrap(o).(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	svc := es.Labels[discoveryv1.LabelServiceName]
	if svc == "" {
		return
	}
	if deleted {
		w.t.ApplySlice(es.Namespace, svc, es.Name, nil)
		return
	}
	sl := SliceOf(es)
	w.t.ApplySlice(es.Namespace, svc, es.Name, &sl)
}

// Annotations that ask for topology-aware routing (kube-proxy's hints).
const (
	annotationTopologyMode  = "service.kubernetes.io/topology-mode"
	annotationTopologyHints = "service.kubernetes.io/topology-aware-hints"
)

// SpecOf is what the table keeps of a Service: its ClusterIPs (none for a
// headless or ExternalName Service), TCP ports, and why egret would leave
// it to kube-proxy.
func SpecOf(s *corev1.Service) Spec {
	sp := Spec{Namespace: s.Namespace, Name: s.Name}
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		return sp
	}
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip); err == nil {
			sp.ClusterIPs = append(sp.ClusterIPs, a.Unmap())
		}
	}
	for _, p := range s.Spec.Ports {
		if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP || p.Port <= 0 || p.Port > 65535 {
			continue
		}
		sp.Ports = append(sp.Ports, ServicePort{Name: p.Name, Port: uint16(p.Port)})
	}
	switch {
	case s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP:
		sp.Unsupported = WhySessionAffinity
	case s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal:
		sp.Unsupported = WhyInternalLocal
	case s.Spec.TrafficDistribution != nil && *s.Spec.TrafficDistribution != "",
		topologyOn(s.Annotations[annotationTopologyMode]), topologyOn(s.Annotations[annotationTopologyHints]):
		sp.Unsupported = WhyTrafficDistributed
	case len(s.Spec.Selector) == 0:
		sp.Unsupported = WhyNoSelector
	}
	return sp
}

func topologyOn(v string) bool { return v != "" && v != "Disabled" && v != "disabled" }

// SliceOf is what the table keeps of an EndpointSlice: the TCP ports, and
// each IP endpoint's first address and conditions (kube-proxy uses the
// first address only). FQDN slices have none.
func SliceOf(es *discoveryv1.EndpointSlice) Slice {
	var sl Slice
	if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
		return sl
	}
	for _, p := range es.Ports {
		if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 || p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		sl.Ports = append(sl.Ports, SlicePort{Name: name, Port: uint16(*p.Port)})
	}
	sl.Endpoints = make([]Endpoint, 0, len(es.Endpoints))
	for _, e := range es.Endpoints {
		if len(e.Addresses) == 0 {
			continue
		}
		a, err := netip.ParseAddr(e.Addresses[0])
		if err != nil {
			continue
		}
		c := e.Conditions
		ready := c.Ready == nil || *c.Ready
		serving := ready
		if c.Serving != nil {
			serving = *c.Serving
		}
		sl.Endpoints = append(sl.Endpoints, Endpoint{Addr: a.Unmap(), Ready: ready, Serving: serving,
			Terminating: c.Terminating != nil && *c.Terminating})
	}
	return sl
}

func trimService(o any) (any, error) {
	if s, ok := o.(*corev1.Service); ok {
		s.ManagedFields = nil
		s.Status = corev1.ServiceStatus{}
	}
	return o, nil
}

func trimSlice(o any) (any, error) {
	if es, ok := o.(*discoveryv1.EndpointSlice); ok {
		es.ManagedFields = nil
		es.Annotations = nil
		for i := range es.Endpoints {
			e := &es.Endpoints[i]
			e.TargetRef, e.Hostname, e.NodeName, e.Zone, e.Hints, e.DeprecatedTopology = nil, nil, nil, nil, nil, nil
			if len(e.Addresses) > 1 {
				e.Addresses = e.Addresses[:1]
			}
		}
	}
	return o, nil
}
