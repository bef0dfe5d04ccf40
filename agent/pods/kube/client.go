package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
)

// coreScheme knows the core/v1 types and nothing else. The source needs
// pods and events only: a clientset would link, and build at start, every
// API group Kubernetes has (about 16 MB of memory in every egret command,
// against 7.5 MB for core/v1, client-go's rest and cache).
var coreScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		panic(err)
	}
	metav1.AddToGroupVersion(s, corev1.SchemeGroupVersion)
	return s
}()

// NewClient returns a client of the core/v1 API for Config.Client and
// NewRecorder, made from cfg (which is not changed).
func NewClient(cfg *rest.Config) (rest.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = serializer.NewCodecFactory(coreScheme).WithoutConversion()
	if c.ContentType == "" {
		c.ContentType = runtime.ContentTypeJSON
	}
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("%w: core/v1 client: %v", ErrConfig, err)
	}
	return rc, nil
}

// NewRecorder returns an EventRecorder writing Events through client (a
// core/v1 client, NewClient) as Component on node, and a function that
// stops it. The agent needs RBAC create and patch on events (patch:
// repeated Events are counted on one).
func NewRecorder(client rest.Interface, node string) (record.EventRecorder, func()) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(eventSink{client})
	return b.NewRecorder(coreScheme, corev1.EventSource{Component: Component, Host: node}), b.Shutdown
}

// eventSink writes Events in their own namespace, as the recorder asks.
type eventSink struct{ c rest.Interface }

var _ record.EventSink = eventSink{}

func (s eventSink) Create(e *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.c.Post().Namespace(e.Namespace).Resource("events").Body(e).Do(context.Background()).Into(out)
	return out, err
}

func (s eventSink) Update(e *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.c.Put().Namespace(e.Namespace).Resource("events").Name(e.Name).Body(e).Do(context.Background()).Into(out)
	return out, err
}

func (s eventSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.c.Patch(types.StrategicMergePatchType).Namespace(e.Namespace).Resource("events").Name(e.Name).
		Body(data).Do(context.Background()).Into(out)
	return out, err
}
