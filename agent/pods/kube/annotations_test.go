package kube

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/egret-proxy/egret/agent/pods"
)

func annotated(a map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Annotations: a}}
}

func TestParseGoodAnnotations(t *testing.T) {
	p, err := Parse(annotated(map[string]string{
		AnnotationEnabled:              "true",
		AnnotationExcludePorts:         "5432, 8443,",
		AnnotationExcludeCIDRs:         "10.1.2.3/8,192.0.2.7, 2001:db8::/32",
		AnnotationDefaultExcludedPorts: "false",
		AnnotationRedirectLoopback:     "true",
		AnnotationListenPort:           "15011",
		AnnotationPolicy:               "defaults:\n  max_attempts: 2\n",
		AnnotationLearnDirect:          "false",
		AnnotationLearnTTL:             "90s",
		AnnotationMaxConnections:       "200",
		AnnotationMaxInFlight:          " 50",
		AnnotationMaxSpoolBytes:        "32MiB",
		"example.com/other":            "not ours",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := pods.Pod{
		Name:       "shop/web",
		ListenPort: 15011,
		Exclude: pods.Exclusions{
			Ports:          []uint16{5432, 8443},
			CIDRs:          []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("2001:db8::/32")},
			NoDefaultPorts: true,
		},
		RedirectLoopback: true,
		Policy:           []byte("defaults:\n  max_attempts: 2\n"),
		Learn:            pods.Learning{Off: true, TTL: 90 * time.Second},
		Limits:           pods.Limits{Conns: 200, InFlight: 50, SpoolBytes: 32 << 20},
	}
	if !p.Equal(want) {
		t.Fatalf("got %+v\nwant %+v", p, want)
	}

	// Only enabled: the agent's defaults.
	p, err = Parse(annotated(map[string]string{AnnotationEnabled: "true"}))
	if err != nil || !p.Equal(pods.Pod{Name: "shop/web"}) {
		t.Fatalf("defaults: %+v %v", p, err)
	}
	// default-excluded-ports and learn-direct "true" keep them on over
	// a node policy that turns them off.
	p, err = Parse(annotated(map[string]string{AnnotationEnabled: "true", AnnotationDefaultExcludedPorts: "true",
		AnnotationLearnDirect: "true"}))
	if err != nil || p.Exclude.NoDefaultPorts || !p.Exclude.DefaultPorts || p.Learn != (pods.Learning{On: true}) {
		t.Fatalf("default-excluded-ports and learn-direct true: %+v %v", p, err)
	}
}

func TestOptedIn(t *testing.T) {
	for v, want := range map[string]bool{"true": true, "false": false, "yes": true /* and Parse refuses it */} {
		if got := OptedIn(annotated(map[string]string{AnnotationEnabled: v})); got != want {
			t.Errorf("OptedIn(%q) = %v", v, got)
		}
	}
	if OptedIn(annotated(nil)) || OptedIn(annotated(map[string]string{AnnotationExcludePorts: "1"})) {
		t.Error("opted in without the enabled annotation")
	}
}

func TestParseBadAnnotations(t *testing.T) {
	cases := []struct {
		key, value, reason string
	}{
		{AnnotationEnabled, "yes", `must be "true" or "false"`},
		{AnnotationExcludePorts, "5432,http", `port "http" is not a number in 1..65535`},
		{AnnotationExcludePorts, "0", `port "0" is not a number`},
		{AnnotationExcludePorts, "70000", `port "70000" is not a number`},
		{AnnotationExcludeCIDRs, "10.0.0.0/33", `"10.0.0.0/33" is neither a CIDR nor an address`},
		{AnnotationExcludeCIDRs, "example.com", `"example.com" is neither`},
		{AnnotationDefaultExcludedPorts, "no", `must be "true" or "false"`},
		{AnnotationRedirectLoopback, "1", `must be "true" or "false"`},
		{AnnotationListenPort, "0", "not a port number in 1..65535"},
		{AnnotationListenPort, "15001x", "not a port number"},
		{AnnotationPolicy, "defaults:\n  max_attempts: 0\n", "max_attempts"},
		{AnnotationPolicy, "defaults:\n  no_such_field: 1\n", "no_such_field"},
		{AnnotationPolicy, "budget: {ratio: 0.5}\n", "budget"}, // a node's field, not a pod's
		{AnnotationPolicy, "defaults: [\n", "pod shop/web policy"},
		{AnnotationLearnDirect, "off", `must be "true" or "false"`},
		{AnnotationLearnTTL, "10", "not a positive duration"},
		{AnnotationLearnTTL, "-1m", "not a positive duration"},
		{"egret.dev/exclude-port", "5432", "unknown egret annotation"},
		{AnnotationMaxConnections, "0", "not a number in 1.."},
		{AnnotationMaxConnections, "-5", "not a number in 1.."},
		{AnnotationMaxInFlight, "lots", "not a number in 1.."},
		{AnnotationMaxSpoolBytes, "2GiB", `not a size such as "32MiB"`},
		{AnnotationMaxSpoolBytes, "0", `not a size`},
	}
	for _, c := range cases {
		a := map[string]string{AnnotationEnabled: "true", c.key: c.value}
		_, err := Parse(annotated(a))
		if !errors.Is(err, ErrAnnotation) {
			t.Errorf("%s=%q: err %v, want ErrAnnotation", c.key, c.value, err)
			continue
		}
		var ae *AnnotationError
		if !errors.As(err, &ae) || ae.Pod != "shop/web" || ae.Annotation != c.key || ae.Value != c.value {
			t.Errorf("%s=%q: %#v", c.key, c.value, ae)
		}
		msg := err.Error()
		for _, part := range []string{"pod shop/web", "annotation " + c.key, c.reason} {
			if !strings.Contains(msg, part) {
				t.Errorf("%s=%q: error %q lacks %q", c.key, c.value, msg, part)
			}
		}
	}

	// Every bad annotation is named, not only the first.
	_, err := Parse(annotated(map[string]string{AnnotationEnabled: "true", AnnotationListenPort: "x", AnnotationExcludePorts: "y"}))
	var names []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ae *AnnotationError
		if errors.As(e, &ae) {
			names = append(names, ae.Annotation)
		}
	}
	if !slices.Equal(names, []string{AnnotationExcludePorts, AnnotationListenPort}) {
		t.Fatalf("errors for %v, want exclude-ports and listen-port: %v", names, err)
	}
}

// The owning workload comes from the controller owner reference; a
// Deployment's ReplicaSet is named for its Deployment.
func TestWorkload(t *testing.T) {
	yes, no := true, false
	owned := func(kind, name string, controller *bool, labels map[string]string) *corev1.Pod {
		p := annotated(map[string]string{AnnotationEnabled: "true"})
		p.Labels = labels
		p.OwnerReferences = []metav1.OwnerReference{{Kind: kind, Name: name, Controller: controller}}
		return p
	}
	hash := map[string]string{"pod-template-hash": "7d9f8b6c5d"}
	for _, c := range []struct {
		pod  *corev1.Pod
		want string
	}{
		{owned("ReplicaSet", "web-7d9f8b6c5d", &yes, hash), "deployment/web"},
		{owned("ReplicaSet", "web-7d9f8b6c5d", &yes, nil), "replicaset/web-7d9f8b6c5d"},
		{owned("ReplicaSet", "web-other", &yes, hash), "replicaset/web-other"},
		{owned("StatefulSet", "db", &yes, nil), "statefulset/db"},
		{owned("DaemonSet", "agent", &yes, nil), "daemonset/agent"},
		{owned("Job", "backup-28911", &yes, nil), "job/backup-28911"},
		{owned("ReplicaSet", "web-7d9f8b6c5d", &no, hash), ""},
		{annotated(map[string]string{AnnotationEnabled: "true"}), ""},
	} {
		if got := Workload(c.pod); got != c.want {
			t.Errorf("owner %v labels %v: %q, want %q", c.pod.OwnerReferences, c.pod.Labels, got, c.want)
		}
		p, err := Parse(c.pod)
		if err != nil || p.Workload != c.want {
			t.Errorf("Parse: workload %q (%v), want %q", p.Workload, err, c.want)
		}
	}
}
