package services

import (
	"context"
	"io"
	"net"
	"net/netip"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/egret-proxy/egret/test/kubeapi"
)

// gate is a TCP forwarder to the apiserver that refuses connections
// until opened: an apiserver unreachable at the agent's start.
type gate struct {
	ln   net.Listener
	to   string
	open atomic.Bool
}

func startGate(t *testing.T, to string) *gate {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, to: to}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !g.open.Load() {
				c.Close()
				continue
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", g.to)
				if err != nil {
					return
				}
				defer u.Close()
				go io.Copy(u, c)
				io.Copy(c, u)
			}()
		}
	}()
	return g
}

// waitFor polls cond (the informers give no event to wait on from here).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWatcherAgainstAPIServer(t *testing.T) {
	c := kubeapi.Start(t)
	ns := c.Namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The agent starts while the apiserver cannot be reached.
	u, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	g := startGate(t, u.Host)
	cfg := rest.CopyConfig(c.Config)
	cfg.Host = "https://" + g.ln.Addr().String()
	cl, err := NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tb := New(Options{})
	w := NewWatcher(tb, cl)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	mk := func(name string, mut func(*corev1.Service)) netip.AddrPort {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		if mut != nil {
			mut(s)
		}
		s, err := c.Client.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return netip.AddrPortFrom(netip.MustParseAddr(s.Spec.ClusterIP), 80)
	}
	vip := mk("backend", nil)
	port, ready, notReady := int32(8080), true, false
	name := "http"
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "backend-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "backend"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.1.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
			{Addresses: []string{"10.1.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
			{Addresses: []string{"10.1.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: &notReady}},
		},
	}
	if _, err := c.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	affinity := mk("sticky", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP })
	manual := mk("manual", func(s *corev1.Service) { s.Spec.Selector = nil })

	// Unreachable: no Service known, so requests go through the ClusterIP.
	if _, _, _, _, ok := tb.Service(vip, ""); ok || w.Synced() {
		t.Fatal("a Service known before the apiserver could be reached")
	}
	g.open.Store(true)
	waitFor(t, "the watcher to sync", w.Synced)
	waitFor(t, "backend's endpoints", func() bool {
		p := tb.Lookup(vip)
		if p == nil {
			return false
		}
		r, _ := p.Ready()
		return r == 2
	})
	svc, sp, eps, why, ok := tb.Service(vip, "")
	if !ok || svc != ns+"/backend" || sp != 80 || eps == nil || why != "" {
		t.Fatalf("Service(%s) = %q %d %v %q %v", vip, svc, sp, eps, why, ok)
	}
	for range 20 {
		a, _ := eps.Pick()
		if a != "10.1.0.1:8080" && a != "10.1.0.2:8080" {
			t.Fatalf("picked %s, not a ready endpoint", a)
		}
		eps.Done(false)
	}
	waitFor(t, "the unsupported Services", func() bool { return tb.Lookup(affinity) != nil && tb.Lookup(manual) != nil })
	if got := tb.Lookup(affinity).Unsupported(); got != WhySessionAffinity {
		t.Errorf("sessionAffinity Service: %q", got)
	}
	if got := tb.Lookup(manual).Unsupported(); got != WhyNoSelector {
		t.Errorf("selector-less Service: %q", got)
	}
	if _, _, eps, why, _ := tb.Service(affinity, ""); eps != nil || why == "" {
		t.Errorf("an unsupported Service is balanced by egret")
	}

	// The slice loses an endpoint: it is reported gone.
	es.Endpoints = es.Endpoints[1:]
	if _, err := c.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tb.Gone():
	case <-time.After(30 * time.Second):
		t.Fatal("no endpoint reported gone")
	}
	if gone, _ := tb.TakeGone(); len(gone) != 1 || gone[0] != "10.1.0.1:8080" {
		t.Errorf("gone %v, want [10.1.0.1:8080]", gone)
	}
	// The Service deleted: its ClusterIP is no Service any more.
	if err := c.Client.CoreV1().Services(ns).Delete(ctx, "backend", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Service to go", func() bool { return tb.Lookup(vip) == nil })
	cancel()
	<-done
}
