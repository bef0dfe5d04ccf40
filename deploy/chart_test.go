package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/test/helm"
	"github.com/egret-proxy/egret/test/kubeapi"
)

const chartDir = "helm/egret"

// helmRun runs helm with its home directories in a temporary one (no
// repositories, nothing of the machine's) and returns its output.
func helmRun(t testing.TB, args ...string) ([]byte, error) {
	t.Helper()
	bin := helm.Binary(t)
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// renderChart runs `helm template` of the chart as release "egret" in
// egret-system with args, and decodes what it prints strictly.
func renderChart(t testing.TB, args ...string) []rendered {
	t.Helper()
	out, err := helmRun(t, append([]string{"template", "egret", chartDir, "--namespace", "egret-system"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeRendered(t, "helm template "+strings.Join(args, " "), out)
}

// typed returns the rendered objects that are k8s.io/api objects, as
// loadManifests gives them.
func typed(rs []rendered) []object {
	var objs []object
	for _, r := range rs {
		if o, ok := r.obj.(runtime.Object); ok {
			objs = append(objs, object{file: r.key(), obj: o})
		}
	}
	return objs
}

// helmLabels are the labels the chart adds to the kustomize base's on
// every object's metadata, with their values for release "egret".
func helmLabels(t testing.TB) map[string]string {
	t.Helper()
	data, err := os.ReadFile(chartDir + "/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"app.kubernetes.io/instance":   "egret",
		"app.kubernetes.io/managed-by": "Helm",
		"app.kubernetes.io/version":    c.AppVersion,
		"helm.sh/chart":                "egret-" + c.Version,
	}
}

// compareWithBase checks that the chart's objects are the kustomize base's
// (all of them but those in skip), field by field, but for the labels
// Helm adds to every object's metadata.
func compareWithBase(t *testing.T, chart []rendered, skip ...string) {
	t.Helper()
	base := map[string]runtime.Object{}
	for _, o := range loadManifests(t) {
		m, _ := metaOf(o.obj)
		k := reflect.TypeOf(o.obj).Elem().Name() + " " + m.GetNamespace() + "/" + m.GetName()
		if !slices.Contains(skip, reflect.TypeOf(o.obj).Elem().Name()) {
			base[k] = o.obj
		}
	}
	extra := helmLabels(t)
	seen := map[string]bool{}
	for _, r := range chart {
		k := r.key()
		seen[k] = true
		want, ok := base[k]
		if !ok {
			t.Errorf("the chart renders %s, which the kustomize base does not have", k)
			continue
		}
		got := r.obj.(runtime.Object).DeepCopyObject()
		m, _ := metaOf(got)
		labels := m.GetLabels()
		for l, v := range extra {
			if labels[l] != v {
				t.Errorf("%s: label %s=%q, want %q", k, l, labels[l], v)
			}
			delete(labels, l)
		}
		m.SetLabels(labels)
		diffs, err := sameObject(want, got)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range diffs {
			t.Errorf("%s: the kustomize base against the chart: %s", k, d)
		}
	}
	for k := range base {
		if !seen[k] {
			t.Errorf("the chart does not render %s of the kustomize base", k)
		}
	}
}

func TestHelmLint(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--set", "namespace.create=true,metrics.podMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.dashboard.enabled=true"},
	} {
		out, err := helmRun(t, append([]string{"lint", "--strict", "--namespace", "egret-system", chartDir}, args...)...)
		if err != nil {
			t.Errorf("helm lint %v: %v\n%s", args, err, out)
		} else if !strings.Contains(string(out), "1 chart(s) linted, 0 chart(s) failed") {
			t.Errorf("helm lint %v says:\n%s", args, out)
		}
	}
}

// With its default values the chart is the kustomize base, but for the
// Namespace: `helm install` keeps its release in the namespace, which so
// must exist before the chart is installed. namespace.create renders it,
// as the base has it.
func TestChartIsTheKustomizeBase(t *testing.T) {
	compareWithBase(t, renderChart(t), "Namespace")
	compareWithBase(t, renderChart(t, "--set", "namespace.create=true"))
}

// Every value does what it says, and the rendered DaemonSet stays a valid
// `egret agent` command line held to what the base's tests check.
func TestChartValues(t *testing.T) {
	const pol = "defaults:\n  max_attempts: 2\nupstreams:\n  - host: payments.internal\n    max_attempts: 1\n"
	valuesFile := t.TempDir() + "/values.yaml"
	values := map[string]any{
		"image":        map[string]any{"repository": "registry.example/egret", "tag": "v9.9.9"},
		"policy":       pol,
		"resources":    map[string]any{"requests": map[string]any{"cpu": "100m", "memory": "128Mi"}, "limits": map[string]any{"memory": "1Gi"}},
		"tolerations":  []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "egress", "effect": "NoSchedule"}},
		"nodeSelector": map[string]any{"kubernetes.io/os": "linux", "pool": "egress"},
		"metrics":      map[string]any{"port": 9190, "podMonitor": map[string]any{"enabled": true, "interval": "30s"}, "prometheusRule": map[string]any{"enabled": true}, "dashboard": map[string]any{"enabled": true}},
		"extraArgs":    []any{"--listen-port=15009"},
	}
	b, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(valuesFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := helmRun(t, "template", "edge", chartDir, "--namespace", "net-agents", "-f", valuesFile)
	if err != nil {
		t.Fatal(err)
	}
	rs := decodeRendered(t, "helm template -f values", out)
	objs := typed(rs)

	ds := only[*appsv1.DaemonSet](t, objs)
	if ds.Name != "edge-egret" || ds.Namespace != "net-agents" {
		t.Errorf("DaemonSet %s/%s, want net-agents/edge-egret", ds.Namespace, ds.Name)
	}
	ctx, c := agentArgs(t, objs)
	if c.Image != "registry.example/egret:v9.9.9" {
		t.Errorf("image %q", c.Image)
	}
	if ctx.String("metrics") != ":9190" || ctx.Uint("listen-port") != 15009 {
		t.Errorf("--metrics %q --listen-port %d, want :9190 and 15009", ctx.String("metrics"), ctx.Uint("listen-port"))
	}
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 9190 || ds.Spec.Template.Annotations["prometheus.io/port"] != "9190" {
		t.Errorf("ports %+v, annotations %v: want the metrics port 9190", c.Ports, ds.Spec.Template.Annotations)
	}
	if c.Resources.Requests.Cpu().String() != "100m" || c.Resources.Limits.Memory().String() != "1Gi" {
		t.Errorf("resources %+v", c.Resources)
	}
	spec := ds.Spec.Template.Spec
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "dedicated" || spec.Tolerations[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("tolerations %+v", spec.Tolerations)
	}
	if !reflect.DeepEqual(spec.NodeSelector, map[string]string{"kubernetes.io/os": "linux", "pool": "egress"}) {
		t.Errorf("nodeSelector %v", spec.NodeSelector)
	}

	// The policy reaches the mounted ConfigMap as written, and parses.
	var cm *corev1.ConfigMap
	for _, o := range objs {
		if c, ok := o.obj.(*corev1.ConfigMap); ok && c.Name == "edge-egret-policy" {
			cm = c
		}
	}
	if cm == nil {
		t.Fatal("no ConfigMap edge-egret-policy")
	}
	if cm.Data["policy.yaml"] != pol {
		t.Errorf("policy.yaml is %q, want %q", cm.Data["policy.yaml"], pol)
	}
	if p, err := policy.Parse("policy.yaml", []byte(cm.Data["policy.yaml"])); err != nil || p.Defaults.MaxAttempts != 2 || len(p.Upstreams) != 1 {
		t.Errorf("rendered policy: %v", err)
	}
	if v, _ := volumeNamed(ds, "policy"); v.ConfigMap == nil || v.ConfigMap.Name != cm.Name {
		t.Errorf("policy volume %+v, want ConfigMap %s", v, cm.Name)
	}

	// RBAC follows the names: the Role names the DaemonSet, the
	// ClusterRole the namespace, the bindings the ServiceAccount.
	sa := only[*corev1.ServiceAccount](t, objs)
	if spec.ServiceAccountName != sa.Name || sa.Namespace != "net-agents" {
		t.Errorf("serviceAccountName %q, ServiceAccount %s/%s", spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
	if r := only[*rbacv1.Role](t, objs); !slices.Equal(r.Rules[0].ResourceNames, []string{ds.Name}) {
		t.Errorf("Role names %v, want the DaemonSet %s", r.Rules[0].ResourceNames, ds.Name)
	}
	cr := only[*rbacv1.ClusterRole](t, objs)
	nsRule := false
	for _, r := range cr.Rules {
		nsRule = nsRule || slices.Equal(r.Resources, []string{"namespaces"}) && slices.Equal(r.ResourceNames, []string{"net-agents"})
	}
	if !nsRule {
		t.Errorf("ClusterRole %+v does not name namespace net-agents", cr.Rules)
	}
	for _, subj := range [][]rbacv1.Subject{only[*rbacv1.ClusterRoleBinding](t, objs).Subjects, only[*rbacv1.RoleBinding](t, objs).Subjects} {
		if len(subj) != 1 || subj[0].Name != sa.Name || subj[0].Namespace != sa.Namespace {
			t.Errorf("binding subjects %+v", subj)
		}
	}

	// The monitoring objects: the same as the kustomize components'.
	checkMonitoring(t, rs, ds, "net-agents")

	// A real API server takes them all as rendered (strict server-side
	// field validation), the DaemonSet included.
	cluster := kubeapi.Start(t)
	apiCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cluster.Client.CoreV1().Namespaces().Create(apiCtx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "net-agents"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if _, err := create(apiCtx, cluster.Client, o.obj.DeepCopyObject()); err != nil {
			t.Errorf("%s: %v", o.file, err)
		}
	}
}

// The schema refuses what would otherwise render something else than
// asked: a misspelt key, a wrong type, an empty policy, a bad port.
// keeper.enabled (default true) renders egret keeper beside the agent, as
// the kustomize base has it; false renders the agent alone, without
// --keeper or the keeper's volume.
func TestChartKeeper(t *testing.T) {
	checkKeeper(t, typed(renderChart(t)))
	objs := typed(renderChart(t, "--set", "keeper.enabled=false"))
	ctx, c := agentArgs(t, objs)
	ds := only[*appsv1.DaemonSet](t, objs)
	if _, ok := keeperContainer(t, ds); ok || ctx.IsSet("keeper") {
		t.Errorf("keeper.enabled=false: a keeper container (%v) or --keeper %q", ok, ctx.String("keeper"))
	}
	for _, m := range c.VolumeMounts {
		if m.Name == "keeper" {
			t.Errorf("keeper.enabled=false: the agent mounts %+v", m)
		}
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "keeper" {
			t.Errorf("keeper.enabled=false: volume %+v", v)
		}
	}
}

func TestChartRefusesBadValues(t *testing.T) {
	for _, set := range []string{
		"imag.tag=v1",
		"metrics.prot=9191",
		"metrics.port=0",
		"metrics.port=http",
		"policy=",
		"image.pullPolicy=Sometimes",
		"extraArgs[0]=agent",
		"metrics.podMonitor.enabeld=true",
		"keeper.enabled=maybe",
		"keeper.socket=/x",
	} {
		out, err := helmRun(t, "template", "egret", chartDir, "--set", set)
		if err == nil {
			t.Errorf("--set %s rendered:\n%.200s", set, out)
		} else if !strings.Contains(err.Error(), "values don't meet the specifications of the schema") {
			t.Errorf("--set %s: %v, want the schema's refusal", set, err)
		}
	}
}
