package kube

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/proxy/policy"
)

// The pod annotations the source reads. Every key with AnnotationPrefix
// must be one of these: an unknown one (a typo) is a bad annotation.
const (
	AnnotationPrefix = "egret.dev/"
	// AnnotationEnabled "true" puts the pod behind egret ("false" or
	// absent: not).
	AnnotationEnabled = AnnotationPrefix + "enabled"
	// AnnotationExcludePorts lists destination ports that always go
	// direct: "5432,8443".
	AnnotationExcludePorts = AnnotationPrefix + "exclude-ports"
	// AnnotationExcludeCIDRs lists destinations that always go direct,
	// prefixes or addresses: "10.0.0.0/8,192.0.2.7".
	AnnotationExcludeCIDRs = AnnotationPrefix + "exclude-cidrs"
	// AnnotationDefaultExcludedPorts "false" drops the agent's default
	// excluded ports (the server-speaks-first protocols), "true" keeps
	// them whatever the node policy's direct.default_ports.
	AnnotationDefaultExcludedPorts = AnnotationPrefix + "default-excluded-ports"
	// AnnotationRedirectLoopback "true" also redirects connects to
	// 127.0.0.0/8 and ::1.
	AnnotationRedirectLoopback = AnnotationPrefix + "redirect-loopback"
	// AnnotationListenPort is the port of the pod's egret listener on
	// 127.0.0.1 and ::1 in its namespace (default: the agent's).
	AnnotationListenPort = AnnotationPrefix + "listen-port"
	// AnnotationPolicy is a policy override, YAML of the pods file's
	// policy: schema, laid over the node's policy for this pod.
	AnnotationPolicy = AnnotationPrefix + "policy"
	// AnnotationLearnDirect "false" turns learned-direct destinations off
	// for the pod, "true" on whatever the node policy's
	// direct.learn.enabled (pods.Learning; absent: the policy decides, on
	// by default).
	AnnotationLearnDirect = AnnotationPrefix + "learn-direct"
	// AnnotationLearnTTL is how long a learned destination stays direct
	// (a Go duration, e.g. "10m").
	AnnotationLearnTTL = AnnotationPrefix + "learn-ttl"
	// AnnotationMaxConnections is the pod's limit of client connections
	// egret holds for it at once: "200" (default: the agent's).
	AnnotationMaxConnections = AnnotationPrefix + "max-connections"
	// AnnotationMaxInFlight is the pod's limit of requests egret serves
	// for it at once: "50".
	AnnotationMaxInFlight = AnnotationPrefix + "max-in-flight"
	// AnnotationMaxSpoolBytes is the pod's limit of request-body bytes
	// egret holds for replays at once: "32MiB".
	AnnotationMaxSpoolBytes = AnnotationPrefix + "max-spool-bytes"
)

var known = []string{
	AnnotationEnabled, AnnotationExcludePorts, AnnotationExcludeCIDRs, AnnotationDefaultExcludedPorts,
	AnnotationRedirectLoopback, AnnotationListenPort, AnnotationPolicy,
	AnnotationLearnDirect, AnnotationLearnTTL,
	AnnotationMaxConnections, AnnotationMaxInFlight, AnnotationMaxSpoolBytes,
}

// AnnotationError is a pod annotation egret cannot use. The pod is left
// out (its connects go direct) until the annotation is fixed. It matches
// ErrAnnotation.
type AnnotationError struct {
	Pod        string // namespace/name
	Annotation string
	Value      string
	Reason     string
}

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("pod %s: annotation %s=%q: %s", e.Pod, e.Annotation, e.Value, e.Reason)
}

// Is makes errors.Is(err, ErrAnnotation) true.
func (e *AnnotationError) Is(target error) bool { return target == ErrAnnotation }

// OptedIn reports whether the pod asks to be put behind egret: its
// AnnotationEnabled is there and is not "false" (any other value than
// "true" is a bad annotation, reported by Parse).
func OptedIn(pod *corev1.Pod) bool {
	v, ok := pod.Annotations[AnnotationEnabled]
	return ok && v != "false"
}

// Parse reads the egret annotations of a pod that opted in into a Pod
// (Name set; Cgroup and Netns are the locator's). Every bad annotation is
// an *AnnotationError; several are joined, in annotation order.
func Parse(pod *corev1.Pod) (pods.Pod, error) {
	name := PodName(pod)
	p := pods.Pod{Name: name, Workload: Workload(pod)}
	var errs []error
	bad := func(key, reason string, args ...any) {
		errs = append(errs, &AnnotationError{Pod: name, Annotation: key, Value: pod.Annotations[key], Reason: fmt.Sprintf(reason, args...)})
	}
	keys := make([]string, 0, len(pod.Annotations))
	for k := range pod.Annotations {
		if strings.HasPrefix(k, AnnotationPrefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := pod.Annotations[k]
		switch k {
		case AnnotationEnabled:
			if v != "true" && v != "false" {
				bad(k, `must be "true" or "false"`)
			}
		case AnnotationExcludePorts:
			for _, f := range list(v) {
				n, err := strconv.ParseUint(f, 10, 16)
				if err != nil || n == 0 {
					bad(k, "port %q is not a number in 1..65535", f)
					continue
				}
				p.Exclude.Ports = append(p.Exclude.Ports, uint16(n))
			}
		case AnnotationExcludeCIDRs:
			for _, f := range list(v) {
				pfx, err := netip.ParsePrefix(f)
				if err != nil {
					a, aerr := netip.ParseAddr(f)
					if aerr != nil {
						bad(k, "%q is neither a CIDR nor an address", f)
						continue
					}
					pfx = netip.PrefixFrom(a, a.BitLen())
				}
				p.Exclude.CIDRs = append(p.Exclude.CIDRs, pfx.Masked())
			}
		case AnnotationDefaultExcludedPorts:
			b, ok := boolean(v)
			if !ok {
				bad(k, `must be "true" or "false"`)
			}
			p.Exclude.NoDefaultPorts, p.Exclude.DefaultPorts = ok && !b, ok && b
		case AnnotationRedirectLoopback:
			b, ok := boolean(v)
			if !ok {
				bad(k, `must be "true" or "false"`)
			}
			p.RedirectLoopback = b
		case AnnotationLearnDirect:
			b, ok := boolean(v)
			if !ok {
				bad(k, `must be "true" or "false"`)
			}
			p.Learn.Off, p.Learn.On = ok && !b, ok && b
		case AnnotationLearnTTL:
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil || d <= 0 {
				bad(k, `not a positive duration (e.g. "10m")`)
				continue
			}
			p.Learn.TTL = d
		case AnnotationListenPort:
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 16)
			if err != nil || n == 0 {
				bad(k, "not a port number in 1..65535")
				continue
			}
			p.ListenPort = uint16(n)
		case AnnotationPolicy:
			// Validated as the pods file's policy: is.
			if _, err := policy.Overlay(policy.Default(), "pod "+name+" policy", []byte(v)); err != nil {
				bad(k, "%v", err)
				continue
			}
			p.Policy = []byte(v)
		case AnnotationMaxConnections, AnnotationMaxInFlight:
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 31)
			if err != nil || n == 0 {
				bad(k, "not a number in 1..%d", 1<<31-1)
				continue
			}
			if k == AnnotationMaxConnections {
				p.Limits.Conns = int(n)
			} else {
				p.Limits.InFlight = int(n)
			}
		case AnnotationMaxSpoolBytes:
			n, err := policy.ParseSize(v)
			if err != nil || n == 0 {
				bad(k, "not a size such as \"32MiB\" (1B..1GiB)")
				continue
			}
			p.Limits.SpoolBytes = n
		default:
			bad(k, "unknown egret annotation (known: %s)", strings.Join(known, ", "))
		}
	}
	if len(errs) > 0 {
		return pods.Pod{}, errors.Join(errs...)
	}
	return p, nil
}

// Workload is the pod's owning workload as kind/name in kubectl's form,
// from its controller owner reference: a ReplicaSet whose name ends in the
// pod's pod-template-hash label is its Deployment's
// ("deployment/web" for ReplicaSet web-7d9f8b6c5d); other kinds are
// themselves ("statefulset/db", "daemonset/agent", "job/backup"). Empty
// for a pod without a controller.
func Workload(pod *corev1.Pod) string {
	for _, o := range pod.OwnerReferences {
		if o.Controller == nil || !*o.Controller || o.Name == "" {
			continue
		}
		kind, name := strings.ToLower(o.Kind), o.Name
		if h := pod.Labels["pod-template-hash"]; kind == "replicaset" && h != "" {
			if base, ok := strings.CutSuffix(name, "-"+h); ok && base != "" {
				kind, name = "deployment", base
			}
		}
		return kind + "/" + name
	}
	return ""
}

// PodName is the name the source gives a pod: namespace/name.
func PodName(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }

// list splits a comma-separated annotation, trimming spaces; empty items
// are skipped (a trailing comma is harmless).
func list(v string) []string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func boolean(v string) (value, ok bool) {
	switch strings.TrimSpace(v) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}
