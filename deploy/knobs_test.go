package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	egretcli "github.com/egret-proxy/egret/cmd/egret/cli"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/test/kubeapi"
)

// The chart's knobs beyond the kustomize base's shape: each renders what
// it says, the rest of the DaemonSet stays what the base's tests hold it
// to, and the API server takes the result.

// renderValues renders the chart as release "egret" in egret-system with
// values (written to a values file, as a person would give them).
func renderValues(t testing.TB, values map[string]any) []rendered {
	t.Helper()
	out, err := renderValuesErr(t, values)
	if err != nil {
		t.Fatal(err)
	}
	return decodeRendered(t, "helm template -f values", out)
}

func renderValuesErr(t testing.TB, values map[string]any) ([]byte, error) {
	t.Helper()
	b, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	f := t.TempDir() + "/values.yaml"
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return helmRun(t, "template", "egret", chartDir, "--namespace", "egret-system", "-f", f)
}

// chartSchema is values.schema.json, decoded.
func chartSchema(t testing.TB) map[string]any {
	t.Helper()
	data, err := os.ReadFile(chartDir + "/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// chartValues is values.yaml, decoded as Helm decodes it.
func chartValues(t testing.TB) map[string]any {
	t.Helper()
	data, err := os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// createAll creates every typed object on a real kube-apiserver (strict
// server-side field validation), in namespace ns.
func createAll(t *testing.T, objs []object, ns string) {
	t.Helper()
	cluster := kubeapi.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		sent := o.obj.DeepCopyObject()
		got, err := create(ctx, cluster.Client, sent)
		if err != nil {
			t.Errorf("%s: %v", o.file, err)
			continue
		}
		diffs, err := storedAsWritten(o.obj, got)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range diffs {
			t.Errorf("%s: stored otherwise than written: %s", o.file, d)
		}
	}
}

// Every knob set at once: the API server takes all the objects as
// rendered, and stores them as written.
func TestChartKnobsOnAPIServer(t *testing.T) {
	objs := typed(renderValues(t, map[string]any{
		"updateStrategy":     map[string]any{"type": "OnDelete"},
		"logLevel":           "debug",
		"logFormat":          "text",
		"hostPaths":          map[string]any{"cgroup": "/sys/fs/cgroup/unified", "bpffs": "/run/cilium/bpffs", "netns": "/var/run/netns"},
		"podSecurityContext": map[string]any{"seLinuxOptions": map[string]any{"type": "spc_t", "level": "s0"}, "appArmorProfile": map[string]any{"type": "Localhost", "localhostProfile": "egret-agent"}},
		"extraEnv":           []any{map[string]any{"name": "GOMEMLIMIT", "value": "400MiB"}, map[string]any{"name": "HOST_IP", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "status.hostIP"}}}},
		"extraVolumes":       []any{map[string]any{"name": "tokens", "secret": map[string]any{"secretName": "egret-tokens"}}},
		"extraVolumeMounts":  []any{map[string]any{"name": "tokens", "mountPath": "/etc/egret-tokens", "readOnly": true}},
		"metrics":            map[string]any{"port": 9090, "networkPolicy": map[string]any{"enabled": true, "from": []any{map[string]any{"ipBlock": map[string]any{"cidr": "10.20.0.0/16"}}}}},
		"structuredPolicy":   map[string]any{"defaults": map[string]any{"max_attempts": 2}, "upstreams": []any{map[string]any{"host": "payments.internal", "port": 8443}}},
	}))
	if len(objs) != 8 {
		t.Errorf("%d objects, want the base's 7 and the NetworkPolicy", len(objs))
	}
	createAll(t, objs, "egret-system")
}

func TestChartUpdateStrategy(t *testing.T) {
	ds := only[*appsv1.DaemonSet](t, typed(renderChart(t, "--set", "updateStrategy.type=OnDelete")))
	if us := ds.Spec.UpdateStrategy; us.Type != appsv1.OnDeleteDaemonSetStrategyType || us.RollingUpdate != nil {
		t.Errorf("updateStrategy.type=OnDelete: %+v", us)
	}
	ds = only[*appsv1.DaemonSet](t, typed(renderChart(t, "--set", "updateStrategy.type=RollingUpdate,maxUnavailable=2")))
	us := ds.Spec.UpdateStrategy
	if us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil ||
		!reflect.DeepEqual(us.RollingUpdate.MaxUnavailable, ptr(intstr.FromInt32(2))) ||
		!reflect.DeepEqual(us.RollingUpdate.MaxSurge, ptr(intstr.FromInt32(0))) {
		t.Errorf("RollingUpdate, maxUnavailable=2: %+v", us.RollingUpdate)
	}
}

func ptr[T any](v T) *T { return &v }

// logLevel and logFormat take exactly what egret's --log-level and
// --log-format take (the schema's enums, each checked by egret's own
// check), and reach both containers; info, egret's default, renders no
// flag (the kustomize base has none).
func TestChartLogValues(t *testing.T) {
	props := chartSchema(t)["properties"].(map[string]any)
	enum := func(name string) []string {
		var out []string
		for _, v := range props[name].(map[string]any)["enum"].([]any) {
			out = append(out, v.(string))
		}
		return out
	}
	defaults := chartValues(t)
	ctx, _ := agentArgs(t, typed(renderChart(t)))
	if ctx.String("log-level") != defaults["logLevel"] || ctx.String("log-format") != defaults["logFormat"] {
		t.Errorf("default values logLevel %v logFormat %v render --log-level %s --log-format %s", defaults["logLevel"], defaults["logFormat"], ctx.String("log-level"), ctx.String("log-format"))
	}
	formats := enum("logFormat")
	for i, level := range enum("logLevel") {
		format := formats[i%len(formats)]
		objs := typed(renderChart(t, "--set", "logLevel="+level+",logFormat="+format))
		ctx, _ := agentArgs(t, objs)
		if err := egretcli.CheckLogFlags(ctx); err != nil {
			t.Errorf("logLevel=%s logFormat=%s: egret refuses the rendered flags: %v", level, format, err)
		}
		if ctx.String("log-level") != level || ctx.String("log-format") != format {
			t.Errorf("logLevel=%s logFormat=%s: --log-level %s --log-format %s", level, format, ctx.String("log-level"), ctx.String("log-format"))
		}
		k, _ := keeperContainer(t, only[*appsv1.DaemonSet](t, objs))
		want := []string{"--log-format=" + format}
		if level != "info" {
			want = append(want, "--log-level="+level)
		}
		if got := k.Args[2:]; !slices.Equal(got, want) {
			t.Errorf("logLevel=%s logFormat=%s: keeper's log flags %q, want %q", level, format, got, want)
		}
	}
	if len(formats) != 2 {
		t.Errorf("logFormat enum %q", formats)
	}
}

// hostPaths move the host side of each hostPath volume; the container
// side, its propagation and the args stay.
func TestChartHostPaths(t *testing.T) {
	base := only[*appsv1.DaemonSet](t, loadManifests(t))
	want := map[string]string{"host-cgroup": "/sys/fs/cgroup/unified", "bpffs": "/run/cilium/bpffs", "netns": "/var/run/netns"}
	objs := typed(renderValues(t, map[string]any{"hostPaths": map[string]any{"cgroup": want["host-cgroup"], "bpffs": want["bpffs"], "netns": want["netns"]}}))
	ds := only[*appsv1.DaemonSet](t, objs)
	agentArgs(t, objs)
	n := 0
	for _, v := range ds.Spec.Template.Spec.Volumes {
		bv, ok := volumeNamed(base, v.Name)
		if !ok {
			t.Errorf("volume %s is not the base's", v.Name)
			continue
		}
		if v.HostPath == nil {
			if !reflect.DeepEqual(v, bv) {
				t.Errorf("volume %s changed: %+v", v.Name, v)
			}
			continue
		}
		n++
		if v.HostPath.Path != want[v.Name] || !reflect.DeepEqual(v.HostPath.Type, bv.HostPath.Type) {
			t.Errorf("volume %s: hostPath %s type %s, want %s type %s", v.Name, v.HostPath.Path, fmtPtr(v.HostPath.Type), want[v.Name], fmtPtr(bv.HostPath.Type))
		}
	}
	if n != len(want) {
		t.Errorf("%d hostPath volumes, want %d (%v): a hostPath the values do not move", n, len(want), want)
	}
	if got, b := agentContainer(t, ds).VolumeMounts, agentContainer(t, base).VolumeMounts; !reflect.DeepEqual(got, b) {
		t.Errorf("the agent's mounts changed:\n%+v\nwant\n%+v", got, b)
	}
}

// podSecurityContext's SELinux options and AppArmor profile land in the
// pod's securityContext (the fields, not the old annotation); the
// containers' own securityContexts stay.
func TestChartSecurityContext(t *testing.T) {
	base := only[*appsv1.DaemonSet](t, loadManifests(t))
	objs := typed(renderValues(t, map[string]any{"podSecurityContext": map[string]any{
		"seLinuxOptions":  map[string]any{"type": "spc_t", "level": "s0"},
		"appArmorProfile": map[string]any{"type": "Localhost", "localhostProfile": "egret-agent"},
	}}))
	ds := only[*appsv1.DaemonSet](t, objs)
	want := &corev1.PodSecurityContext{
		SELinuxOptions:  &corev1.SELinuxOptions{Type: "spc_t", Level: "s0"},
		AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeLocalhost, LocalhostProfile: ptr("egret-agent")},
	}
	if got := ds.Spec.Template.Spec.SecurityContext; !reflect.DeepEqual(got, want) {
		t.Errorf("pod securityContext %+v, want %+v", got, want)
	}
	for i, c := range ds.Spec.Template.Spec.Containers {
		if !reflect.DeepEqual(c.SecurityContext, base.Spec.Template.Spec.Containers[i].SecurityContext) {
			t.Errorf("container %s's securityContext changed: %+v", c.Name, c.SecurityContext)
		}
	}
	for k := range ds.Spec.Template.Annotations {
		if strings.Contains(k, "apparmor") {
			t.Errorf("annotation %s: the field, not the annotation", k)
		}
	}
	ds = only[*appsv1.DaemonSet](t, typed(renderChart(t, "--set", "podSecurityContext.appArmorProfile.type=Unconfined")))
	if sc := ds.Spec.Template.Spec.SecurityContext; sc == nil || sc.SELinuxOptions != nil || sc.AppArmorProfile == nil || sc.AppArmorProfile.Type != corev1.AppArmorProfileTypeUnconfined {
		t.Errorf("appArmorProfile.type=Unconfined alone: %+v", sc)
	}
}

// extraEnv, extraVolumes and extraVolumeMounts add to the agent
// container what they say, after the chart's own; GOMEMLIMIT in extraEnv
// replaces the chart's.
func TestChartExtras(t *testing.T) {
	base := only[*appsv1.DaemonSet](t, loadManifests(t))
	objs := typed(renderValues(t, map[string]any{
		"extraEnv": []any{
			map[string]any{"name": "GOMEMLIMIT", "value": "400MiB"},
			map[string]any{"name": "SSL_CERT_DIR", "value": "/etc/egret-ca"},
			map[string]any{"name": "HOST_IP", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "status.hostIP"}}},
		},
		"extraVolumes": []any{
			map[string]any{"name": "tokens", "secret": map[string]any{"secretName": "egret-tokens"}},
			map[string]any{"name": "ca", "configMap": map[string]any{"name": "egret-ca"}},
		},
		"extraVolumeMounts": []any{
			map[string]any{"name": "tokens", "mountPath": "/etc/egret-tokens", "readOnly": true},
			map[string]any{"name": "ca", "mountPath": "/etc/egret-ca", "readOnly": true},
		},
	}))
	ds := only[*appsv1.DaemonSet](t, objs)
	_, c := agentArgs(t, objs)
	bc := agentContainer(t, base)

	var names []string
	for _, e := range c.Env {
		names = append(names, e.Name)
	}
	if want := []string{"NODE_NAME", "POD_NAME", "POD_NAMESPACE", "GOMEMLIMIT", "SSL_CERT_DIR", "HOST_IP"}; !slices.Equal(names, want) {
		t.Errorf("env %q, want %q", names, want)
	}
	if e := c.Env[3]; e.Value != "400MiB" || e.ValueFrom != nil {
		t.Errorf("GOMEMLIMIT %+v, want 400MiB from extraEnv", e)
	}
	if !reflect.DeepEqual(c.Env[:3], bc.Env[:3]) {
		t.Errorf("the chart's env changed: %+v", c.Env[:3])
	}
	if e := c.Env[5]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.hostIP" {
		t.Errorf("HOST_IP %+v", e)
	}

	n := len(bc.VolumeMounts)
	if len(c.VolumeMounts) != n+2 || !reflect.DeepEqual(c.VolumeMounts[:n], bc.VolumeMounts) {
		t.Fatalf("mounts %+v: want the base's, then two", c.VolumeMounts)
	}
	if m := c.VolumeMounts[n]; m.Name != "tokens" || m.MountPath != "/etc/egret-tokens" || !m.ReadOnly {
		t.Errorf("mount %+v", m)
	}
	vs := ds.Spec.Template.Spec.Volumes
	nv := len(base.Spec.Template.Spec.Volumes)
	if len(vs) != nv+2 || vs[nv].Name != "tokens" || vs[nv].Secret == nil || vs[nv].Secret.SecretName != "egret-tokens" ||
		vs[nv+1].ConfigMap == nil || vs[nv+1].ConfigMap.Name != "egret-ca" {
		t.Errorf("volumes %+v: want the base's, then tokens and ca", vs)
	}
	// The keeper gets none of it.
	if k, _ := keeperContainer(t, ds); len(k.Env) != 0 || len(k.VolumeMounts) != 1 {
		t.Errorf("keeper env %+v mounts %+v", k.Env, k.VolumeMounts)
	}
}

// metrics.networkPolicy admits to the agents' metrics port the sources
// named, and only to that port; it selects the DaemonSet's pods and
// follows metrics.port.
func TestChartNetworkPolicy(t *testing.T) {
	from := []any{
		map[string]any{
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}},
			"podSelector":       map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "prometheus"}},
		},
		map[string]any{"ipBlock": map[string]any{"cidr": "10.20.0.0/16"}},
	}
	objs := typed(renderValues(t, map[string]any{"metrics": map[string]any{"port": 9191, "networkPolicy": map[string]any{"enabled": true, "from": from}}}))
	ds := only[*appsv1.DaemonSet](t, objs)
	np := only[*networkingv1.NetworkPolicy](t, objs)
	if np.Name != "egret-metrics" || np.Namespace != ds.Namespace {
		t.Errorf("NetworkPolicy %s/%s", np.Namespace, np.Name)
	}
	if !labelsSelect(np.Spec.PodSelector.MatchLabels, ds.Spec.Template.Labels) || len(np.Spec.PodSelector.MatchExpressions) != 0 {
		t.Errorf("podSelector %+v does not select the agents %v", np.Spec.PodSelector, ds.Spec.Template.Labels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policyTypes %v, want Ingress alone (the agent must reach the API server)", np.Spec.PolicyTypes)
	}
	_, c := agentArgs(t, objs)
	if len(np.Spec.Ingress) != 1 {
		t.Fatalf("ingress %+v, want one rule", np.Spec.Ingress)
	}
	rule := np.Spec.Ingress[0]
	if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || rule.Ports[0].Port.IntValue() != int(c.Ports[0].ContainerPort) ||
		rule.Ports[0].Protocol == nil || *rule.Ports[0].Protocol != corev1.ProtocolTCP || c.Ports[0].ContainerPort != 9191 {
		t.Errorf("ports %+v, want TCP %d (the metrics port)", rule.Ports, c.Ports[0].ContainerPort)
	}
	var wantFrom []networkingv1.NetworkPolicyPeer
	b, _ := json.Marshal(from)
	if err := json.Unmarshal(b, &wantFrom); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rule.From, wantFrom) {
		t.Errorf("from %+v, want %+v", rule.From, wantFrom)
	}
}

// structuredPolicy is rendered into the ConfigMap and parsed by egret's
// own policy parser into exactly the policy its text form gives.
func TestChartStructuredPolicy(t *testing.T) {
	const text = `defaults:
  max_attempts: 2
  timeout: 10s
  method_default: on
  backoff: {kind: decorrelated, base: 50ms, max: 2s}
  transient_statuses: [500]
  body: {memory_limit: 128KiB, spool_limit: 16MiB}
deny_destinations: [169.254.0.0/16]
direct:
  ports: [5432, 9000]
  cidrs: [10.20.0.0/16]
  learn: {enabled: false}
upstreams:
  - host: payments.internal
    port: 8443
    name: payments
    max_attempts: 4
    budget: {ratio: 0.1, min_per_second: 5, ttl: 30s}
    routes:
      - {method: POST, path_prefix: /v1/charges, idempotent: false}
      - {method: "*", path_prefix: /v1/admin/, idempotent: false}
  - service: shop/ledger
    port: 8080
    bulkhead: 64
  - host: "*.cache.internal"
    protocol: h2c
`
	var structured map[string]any
	if err := yaml.Unmarshal([]byte(text), &structured); err != nil {
		t.Fatal(err)
	}
	fromMap := loadPolicy(t, typed(renderValues(t, map[string]any{"structuredPolicy": structured})))
	fromText := loadPolicy(t, typed(renderValues(t, map[string]any{"policy": text})))
	want, err := policy.Parse("egret-policy/policy.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string]*policy.Policy{"structuredPolicy": fromMap, "policy": fromText} {
		var diffs []string
		exportedDiff(reflect.ValueOf(*got.Defaults), reflect.ValueOf(*want.Defaults), "defaults", &diffs)
		exportedDiff(reflect.ValueOf(got.Direct), reflect.ValueOf(want.Direct), "direct", &diffs)
		exportedDiff(reflect.ValueOf(got.DenyDestinations), reflect.ValueOf(want.DenyDestinations), "deny_destinations", &diffs)
		if len(got.Upstreams) != len(want.Upstreams) {
			t.Fatalf("%s: %d upstreams, want %d", name, len(got.Upstreams), len(want.Upstreams))
		}
		for i := range got.Upstreams {
			exportedDiff(reflect.ValueOf(*got.Upstreams[i]), reflect.ValueOf(*want.Upstreams[i]), "upstreams", &diffs)
		}
		for _, d := range diffs {
			t.Errorf("%s: %s", name, d)
		}
	}
	if fromMap.Defaults.MaxAttempts != 2 || len(fromMap.Upstreams) != 3 || fromMap.Direct.Learn {
		t.Errorf("structuredPolicy parsed as %+v", fromMap.Defaults)
	}

	// A structured policy the parser refuses renders (its shape is
	// right), and the agent's parser names the field as the values do.
	bad := map[string]any{"defaults": map[string]any{"backoff": map[string]any{"base": "2s", "max": "1s"}}}
	cm := only[*corev1.ConfigMap](t, typed(renderValues(t, map[string]any{"structuredPolicy": bad})))
	_, err = policy.Parse("egret-policy/policy.yaml", []byte(cm.Data["policy.yaml"]))
	var pe *policy.Error
	if !errors.As(err, &pe) || !errors.Is(err, policy.ErrConflict) || !strings.HasPrefix(pe.Path, "defaults.backoff.") {
		t.Errorf("backoff base above max: %v, want a conflict on defaults.backoff", err)
	}
}

// Every field of a policy file (proxy/policy/testdata/example.yaml has
// them all) passes the schema as structuredPolicy and reaches the parser,
// which finds nothing wrong but the files it names (absent here).
func TestChartStructuredPolicyExample(t *testing.T) {
	data, err := os.ReadFile("../proxy/policy/testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var example map[string]any
	if err := yaml.Unmarshal(data, &example); err != nil {
		t.Fatal(err)
	}
	cm := only[*corev1.ConfigMap](t, typed(renderValues(t, map[string]any{"structuredPolicy": example})))
	_, err = policy.Parse(t.TempDir()+"/policy.yaml", []byte(cm.Data["policy.yaml"]))
	var es policy.Errors
	if !errors.As(err, &es) || len(es) == 0 {
		t.Fatalf("example as structuredPolicy: %v, want the files it names missing", err)
	}
	for _, e := range es {
		if !errors.Is(e, policy.ErrFile) {
			t.Errorf("example as structuredPolicy: %v", e)
		}
	}
}

// schemaObjects returns, for each object of the structured policy's schema
// (by policy path: "", "defaults", "upstreams[0].tls", ...), its property
// names.
func schemaObjects(t testing.TB) map[string][]string {
	t.Helper()
	s := chartSchema(t)
	defs := s["definitions"].(map[string]any)
	resolve := func(n map[string]any) map[string]any {
		if ref, ok := n["$ref"].(string); ok {
			return defs[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any)
		}
		return n
	}
	out := map[string][]string{}
	var walk func(n map[string]any, at string)
	walk = func(n map[string]any, at string) {
		n = resolve(n)
		switch n["type"] {
		case "object":
			props, _ := n["properties"].(map[string]any)
			if n["additionalProperties"] != false {
				t.Errorf("structuredPolicy schema at %q takes any key", at)
			}
			var names []string
			for k, v := range props {
				names = append(names, k)
				walk(v.(map[string]any), strings.TrimPrefix(at+"."+k, "."))
			}
			sort.Strings(names)
			out[at] = names
		case "array":
			walk(n["items"].(map[string]any), at+"[0]")
		}
	}
	walk(defs["policy"].(map[string]any), "")
	return out
}

// The schema of structuredPolicy and egret's policy parser know the same
// keys, object by object: an unknown key put in each object the schema
// describes draws the parser's list of the keys it takes there, which must
// be the schema's (but for the two the parser refuses under defaults,
// which the schema leaves out).
func TestStructuredPolicySchemaIsTheParsers(t *testing.T) {
	refusedUnderDefaults := map[string][]string{"defaults": {"credential"}, "defaults.tls": {"server_name"}}
	want := regexp.MustCompile(`^unknown field \(want one of (.*)\)$`)
	objs := schemaObjects(t)
	if len(objs) < 10 {
		t.Fatalf("the schema describes %d objects of the policy", len(objs))
	}
	for at, names := range objs {
		// The document with "zz_unknown: 1" at path at.
		var doc any = map[string]any{"zz_unknown": 1}
		parts := strings.Split(at, ".")
		if at == "" {
			parts = nil
		}
		for i := len(parts) - 1; i >= 0; i-- {
			p := parts[i]
			if name, ok := strings.CutSuffix(p, "[0]"); ok {
				if name == "upstreams" {
					doc.(map[string]any)["host"] = "a.test"
				}
				doc = map[string]any{name: []any{doc}}
			} else {
				doc = map[string]any{p: doc}
			}
		}
		src, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		_, err = policy.Parse("p.yaml", src)
		var pe *policy.Error
		var es policy.Errors
		errors.As(err, &es)
		for _, e := range es {
			if errors.Is(e, policy.ErrUnknownField) {
				pe = e
			}
		}
		if pe == nil {
			t.Errorf("%q: %v, want an unknown field", at, err)
			continue
		}
		m := want.FindStringSubmatch(pe.Msg)
		if m == nil {
			t.Errorf("%q: %v", at, pe)
			continue
		}
		parser := strings.Split(m[1], ", ")
		parser = slices.DeleteFunc(parser, func(k string) bool { return slices.Contains(refusedUnderDefaults[at], k) })
		if !slices.Equal(parser, names) {
			t.Errorf("structuredPolicy at %q: the schema takes %q, egret's parser %q", at, names, parser)
		}
	}
}

// The DaemonSet's hostPath volumes are those hostPaths moves: a hostPath
// added to the templates without a value fails here.
func TestChartHostPathsAreValues(t *testing.T) {
	hp := chartValues(t)["hostPaths"].(map[string]any)
	var paths []string
	for _, v := range hp {
		paths = append(paths, v.(string))
	}
	for _, v := range only[*appsv1.DaemonSet](t, typed(renderChart(t))).Spec.Template.Spec.Volumes {
		if v.HostPath != nil && !slices.Contains(paths, v.HostPath.Path) {
			t.Errorf("volume %s: hostPath %s is no hostPaths value", v.Name, v.HostPath.Path)
		}
	}
}

// What neither the schema nor the API would catch before the pods start
// is refused at render time with a message naming the value.
func TestChartRefusesBadKnobs(t *testing.T) {
	for _, tc := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"updateStrategy": map[string]any{"type": "Recreate"}}, "at '/updateStrategy/type'"},
		{map[string]any{"logLevel": "trace"}, "at '/logLevel'"},
		{map[string]any{"logFormat": "xml"}, "at '/logFormat'"},
		{map[string]any{"hostPaths": map[string]any{"cgroup": "sys/fs/cgroup", "bpffs": "/sys/fs/bpf", "netns": "/run/netns"}}, "at '/hostPaths/cgroup'"},
		{map[string]any{"hostPaths": map[string]any{"cgroup": "/", "bpffs": "/sys/fs/bpf", "netns": "/run/netns"}}, "at '/hostPaths/cgroup'"},
		{map[string]any{"podSecurityContext": map[string]any{"appArmorProfile": map[string]any{"type": "Localhost"}}}, "missing property 'localhostProfile'"},
		{map[string]any{"podSecurityContext": map[string]any{"appArmorProfile": map[string]any{"type": "RuntimeDefault", "localhostProfile": "x"}}}, "at '/podSecurityContext/appArmorProfile'"},
		{map[string]any{"podSecurityContext": map[string]any{"seLinuxOptions": map[string]any{"typ": "spc_t"}}}, "'typ' not allowed"},
		{map[string]any{"podSecurityContext": map[string]any{"runAsUser": 1000}}, "'runAsUser' not allowed"},
		{map[string]any{"extraArgs": []any{"--log-level=debug"}}, "extraArgs: --log-level is set by the value logLevel"},
		{map[string]any{"extraArgs": []any{"--log-format=text"}}, "extraArgs: --log-format is set by the value logFormat"},
		{map[string]any{"extraEnv": []any{map[string]any{"name": "NODE_NAME", "value": "x"}}}, "extraEnv: NODE_NAME is the chart's"},
		{map[string]any{"extraEnv": []any{map[string]any{"nmae": "X"}}}, "at '/extraEnv/0'"},
		{map[string]any{"extraVolumes": []any{map[string]any{"name": "tmp", "emptyDir": map[string]any{}}}}, `extraVolumes: "tmp" is a volume of the chart's`},
		{map[string]any{"extraVolumes": []any{map[string]any{"name": "a", "emptyDir": map[string]any{}}, map[string]any{"name": "a", "emptyDir": map[string]any{}}}}, `extraVolumes: "a" is named twice`},
		{map[string]any{"extraVolumeMounts": []any{map[string]any{"name": "nope", "mountPath": "/x"}}}, `extraVolumeMounts: /x mounts "nope", which is not one of extraVolumes`},
		{map[string]any{"extraVolumes": []any{map[string]any{"name": "a", "emptyDir": map[string]any{}}}, "extraVolumeMounts": []any{map[string]any{"name": "a", "mountPath": "/tmp/"}}}, "extraVolumeMounts: /tmp/ is where the chart mounts one of its own volumes"},
		{map[string]any{"extraVolumeMounts": []any{map[string]any{"name": "a", "mountPath": "relative"}}}, "at '/extraVolumeMounts/0/mountPath'"},
		{map[string]any{"metrics": map[string]any{"port": 9090, "networkPolicy": map[string]any{"enabled": true}}}, "metrics.networkPolicy.from must name who may reach the metrics port"},
		{map[string]any{"metrics": map[string]any{"port": 9090, "networkPolicy": map[string]any{"enabled": true, "from": []any{map[string]any{"podSelectr": map[string]any{}}}}}}, "'podSelectr' not allowed"},
		{map[string]any{"structuredPolicy": map[string]any{"defaults": map[string]any{"max_attempt": 2}}}, "'max_attempt' not allowed"},
		{map[string]any{"structuredPolicy": map[string]any{"defaults": map[string]any{"max_attempts": "two"}}}, "at '/structuredPolicy/defaults/max_attempts'"},
		{map[string]any{"structuredPolicy": map[string]any{"defaults": map[string]any{"credential": map[string]any{"bearer_token_file": "/t"}}}}, "'credential' not allowed"},
		{map[string]any{"structuredPolicy": map[string]any{"upstreams": []any{map[string]any{"host": "a.test", "routes": []any{map[string]any{"methd": "POST"}}}}}}, "'methd' not allowed"},
		{map[string]any{"structuredPolicy": map[string]any{"upstreams": map[string]any{"host": "a.test"}}}, "at '/structuredPolicy/upstreams'"},
		{map[string]any{"structuredPolicy": map[string]any{"defaults": map[string]any{"max_attempts": 2}}, "policy": "defaults: {max_attempts: 3}\n"}, "structuredPolicy and policy are both set"},
	} {
		out, err := renderValuesErr(t, tc.values)
		if err == nil {
			t.Errorf("%v rendered:\n%.300s", tc.values, out)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v\nwant %q", tc.values, err, tc.want)
		}
	}
	// The policy's default text is files/default-policy.yaml, the
	// kustomize base's: with it left alone structuredPolicy is taken.
	if _, err := renderValuesErr(t, map[string]any{"structuredPolicy": map[string]any{"defaults": map[string]any{"max_attempts": 2}}}); err != nil {
		t.Errorf("structuredPolicy with policy at its default: %v", err)
	}
}

// README's values table: every value of values.yaml is in it (its path or
// a parent's, for the free-form maps), and every path it names is a value.
func TestReadmeValuesTable(t *testing.T) {
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "\n| value | default | |\n|---|---|---|\n")
	if !ok {
		t.Fatal("README.md has no values table (| value | default | |)")
	}
	documented := map[string]bool{}
	code := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(after, "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		first := strings.Split(line, "|")[1]
		for _, m := range code.FindAllStringSubmatch(first, -1) {
			documented[m[1]] = true
		}
	}
	values := chartValues(t)
	var missing []string
	var walk func(v map[string]any, at string)
	walk = func(v map[string]any, at string) {
		for k, x := range v {
			p := strings.TrimPrefix(at+"."+k, ".")
			covered := false
			for q := p; q != "."; q = path.Dir(strings.ReplaceAll(q, ".", "/")) {
				q = strings.ReplaceAll(q, "/", ".")
				if documented[q] {
					covered = true
					break
				}
			}
			if m, isMap := x.(map[string]any); isMap && !documented[p] && len(m) > 0 {
				walk(m, p)
				continue
			}
			if !covered {
				missing = append(missing, p)
			}
		}
	}
	walk(values, "")
	sort.Strings(missing)
	for _, p := range missing {
		t.Errorf("value %s is not in README.md's values table", p)
	}
	for p := range documented {
		var x any = values
		for _, k := range strings.Split(p, ".") {
			m, ok := x.(map[string]any)
			if !ok {
				x = nil
				break
			}
			x, ok = m[k]
			if !ok {
				x = nil
				break
			}
		}
		if x == nil {
			t.Errorf("README.md's values table names %s, which values.yaml does not have", p)
		}
	}
}

// files/default-policy.yaml, by which the chart tells policy left at its
// default from one set, is the kustomize base's policy and values.yaml's
// (`go generate ./deploy` writes it).
func TestDefaultPolicyCopy(t *testing.T) {
	data, err := os.ReadFile(chartDir + "/files/default-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cm := only[*corev1.ConfigMap](t, loadManifests(t))
	if string(data) != cm.Data["policy.yaml"] {
		t.Errorf("%s/files/default-policy.yaml is not ConfigMap %s's policy.yaml: run go generate ./deploy", chartDir, cm.Name)
	}
	if v := chartValues(t)["policy"]; v != string(data) {
		t.Errorf("values.yaml's policy is not files/default-policy.yaml")
	}
}

// helm lint --strict with every knob set.
func TestHelmLintKnobs(t *testing.T) {
	b, err := yaml.Marshal(map[string]any{
		"updateStrategy":     map[string]any{"type": "OnDelete"},
		"logLevel":           "warn",
		"hostPaths":          map[string]any{"cgroup": "/sys/fs/cgroup/unified", "bpffs": "/sys/fs/bpf", "netns": "/var/run/netns"},
		"podSecurityContext": map[string]any{"seLinuxOptions": map[string]any{"type": "spc_t"}, "appArmorProfile": map[string]any{"type": "Unconfined"}},
		"extraEnv":           []any{map[string]any{"name": "X", "value": "1"}},
		"extraVolumes":       []any{map[string]any{"name": "tokens", "secret": map[string]any{"secretName": "egret-tokens"}}},
		"extraVolumeMounts":  []any{map[string]any{"name": "tokens", "mountPath": "/etc/egret-tokens"}},
		"metrics":            map[string]any{"port": 9090, "networkPolicy": map[string]any{"enabled": true, "from": []any{map[string]any{"podSelector": map[string]any{}}}}},
		"structuredPolicy":   map[string]any{"defaults": map[string]any{"max_attempts": 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := t.TempDir() + "/values.yaml"
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := helmRun(t, "lint", "--strict", "--namespace", "egret-system", chartDir, "-f", f)
	if err != nil || !strings.Contains(string(out), "1 chart(s) linted, 0 chart(s) failed") {
		t.Errorf("helm lint: %v\n%s", err, out)
	}
}
