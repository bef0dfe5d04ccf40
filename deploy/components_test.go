package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

const componentsDir = manifestDir + "/components"

// kustomize renders the kustomization in dir with the kustomize built
// into kubectl (offline: nothing is fetched).
func kustomize(t testing.TB, dir string) []byte {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	testenv.Require(t, err == nil, "kubectl, for `kubectl kustomize`")
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v: %s", dir, err, stderr.String())
	}
	return out
}

// overlay writes a kustomization that uses the base and the named
// components, in a temporary directory, and returns it.
func overlay(t testing.TB, components ...string) string {
	t.Helper()
	dir := t.TempDir()
	rel := func(p string) string {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		// kustomize takes no absolute path to another kustomization.
		r, err := filepath.Rel(dir, abs)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + rel(manifestDir) + "\n"
	if len(components) > 0 {
		k += "components:\n"
		for _, c := range components {
			k += "  - " + rel(filepath.Join(componentsDir, c)) + "\n"
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// kustomize's rendering of the base is the manifests as the tests read
// them: nothing added, nothing lost.
func TestKustomizeRendersTheBase(t *testing.T) {
	rs := decodeRendered(t, "kubectl kustomize "+manifestDir, kustomize(t, manifestDir))
	got := map[string]any{}
	for _, r := range rs {
		got[r.key()] = r.obj
	}
	objs := loadManifests(t)
	if len(rs) != len(objs) {
		t.Errorf("kustomize renders %d objects, the files have %d", len(rs), len(objs))
	}
	for _, o := range objs {
		m, _ := metaOf(o.obj)
		k := reflect.TypeOf(o.obj).Elem().Name() + " " + m.GetNamespace() + "/" + m.GetName()
		r, ok := got[k]
		if !ok {
			t.Errorf("kustomize does not render %s", k)
			continue
		}
		diffs, err := sameObject(o.obj, r)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range diffs {
			t.Errorf("%s: the files against kustomize's rendering: %s", k, d)
		}
	}
}

// Each component renders on top of the base (alone and all together),
// adds exactly its objects, and they carry the rules and the dashboard as
// they are in deploy/prometheus and deploy/dashboards.
func TestKustomizeComponents(t *testing.T) {
	entries, err := os.ReadDir(componentsDir)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, e := range entries {
		all = append(all, e.Name())
	}
	adds := map[string][]string{
		"podmonitor":     {"PodMonitor egret-system/egret"},
		"prometheusrule": {"PrometheusRule egret-system/egret"},
		"dashboard":      {"ConfigMap egret-system/egret-dashboard"},
	}
	var names []string
	for n := range adds {
		names = append(names, n)
	}
	slices.Sort(names)
	if !slices.Equal(all, names) {
		t.Fatalf("components %v, the test knows %v", all, names)
	}
	base := len(loadManifests(t))
	ds := only[*appsv1.DaemonSet](t, loadManifests(t))
	for _, set := range append(slicesOfOne(names), names) {
		rs := decodeRendered(t, "overlay with "+strings.Join(set, ","), kustomize(t, overlay(t, set...)))
		var want, got []string
		for _, c := range set {
			want = append(want, adds[c]...)
		}
		for _, r := range rs {
			switch r.obj.(type) {
			case *podMonitor, *prometheusRule:
				got = append(got, r.key())
			case *corev1.ConfigMap:
				if r.name != "egret-policy" {
					got = append(got, r.key())
				}
			}
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) || len(rs) != base+len(want) {
			t.Errorf("components %v: %d objects, added %v; want %d, %v", set, len(rs), got, base+len(want), want)
		}
		if len(set) == len(names) {
			checkMonitoring(t, rs, ds, "egret-system")
		}
	}
}

func slicesOfOne(s []string) [][]string {
	var out [][]string
	for _, x := range s {
		out = append(out, []string{x})
	}
	return out
}

// checkMonitoring checks the PodMonitor, PrometheusRule and dashboard
// ConfigMap among rs (a chart's or the components'): the PodMonitor
// scrapes the DaemonSet ds's pods and labels them as prometheus.yml does;
// the rules and the dashboard are deploy's own.
func checkMonitoring(t *testing.T, rs []rendered, ds *appsv1.DaemonSet, ns string) {
	t.Helper()
	var pms []*podMonitor
	var prs []*prometheusRule
	var dash []*corev1.ConfigMap
	for _, r := range rs {
		switch o := r.obj.(type) {
		case *podMonitor:
			pms = append(pms, o)
		case *prometheusRule:
			prs = append(prs, o)
		case *corev1.ConfigMap:
			if _, ok := o.Data["egret-node.json"]; ok {
				dash = append(dash, o)
			}
		}
	}
	if len(pms) != 1 || len(prs) != 1 || len(dash) != 1 {
		t.Fatalf("%d PodMonitors, %d PrometheusRules, %d dashboard ConfigMaps; want one each", len(pms), len(prs), len(dash))
	}

	pm := pms[0]
	if pm.Metadata.Namespace != ns {
		t.Errorf("PodMonitor in %q, want %q", pm.Metadata.Namespace, ns)
	}
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("PodMonitor selector %v does not select the agents' pods %v (%v)", pm.Spec.Selector, ds.Spec.Template.Labels, err)
	}
	// prometheus.yml's job, whose name the rules and the dashboard match
	// (up{job="egret"}), is the value of the pod label jobLabel names.
	prom := loadPromConfig(t)
	if job := ds.Spec.Template.Labels[pm.Spec.JobLabel]; job != prom.ScrapeConfigs[0].JobName {
		t.Errorf("PodMonitor jobLabel %q gives job %q, the scrape job is %q", pm.Spec.JobLabel, job, prom.ScrapeConfigs[0].JobName)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("PodMonitor endpoints %+v", pm.Spec.PodMetricsEndpoints)
	}
	ep := pm.Spec.PodMetricsEndpoints[0]
	c := agentContainer(t, ds)
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == ep.Port }) || ep.Path != "/metrics" {
		t.Errorf("PodMonitor scrapes port %q path %q; the agent serves /metrics on %+v", ep.Port, ep.Path, c.Ports)
	}
	// The labels prometheus.yml sets from discovery, the PodMonitor sets
	// too (but pod, which the operator sets itself).
	want := map[string][]string{}
	for _, rc := range prom.ScrapeConfigs[0].RelabelConfigs {
		if rc.TargetLabel != "" && rc.TargetLabel != "pod" {
			want[rc.TargetLabel] = rc.SourceLabels
		}
	}
	got := map[string][]string{}
	for _, rl := range ep.Relabelings {
		got[rl.TargetLabel] = rl.SourceLabels
	}
	if len(want) == 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("PodMonitor relabelings %v, prometheus.yml's %v", got, want)
	}

	if pr := prs[0]; pr.Metadata.Namespace != ns || !reflect.DeepEqual(pr.Spec, loadRules(t)) {
		t.Errorf("PrometheusRule %s/%s: spec is not %s", pr.Metadata.Namespace, pr.Metadata.Name, rulesFile)
	}

	src, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if d := dash[0]; d.Data["egret-node.json"] != string(src) || d.Labels["grafana_dashboard"] != "1" || len(d.Data) != 1 {
		t.Errorf("dashboard ConfigMap %s: labels %v, keys %d, same as %s: %v", d.Name, d.Labels, len(d.Data), dashboardFile, d.Data["egret-node.json"] == string(src))
	}
}

// Neither kustomize nor Helm reads a file outside its own directory: the
// components and the chart carry copies (`go generate ./deploy`), which
// must be the sources as they are.
func TestCopiesAreTheSources(t *testing.T) {
	for copy, src := range map[string]string{
		componentsDir + "/dashboard/egret-node.json": dashboardFile,
		chartDir + "/files/egret-node.json":          dashboardFile,
		chartDir + "/files/egret-rules.yaml":         rulesFile,
	} {
		a, err := os.ReadFile(copy)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s is not %s: run go generate ./deploy", copy, src)
		}
	}
	data, err := os.ReadFile(componentsDir + "/prometheusrule/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs := decodeRendered(t, "prometheusrule.yaml", data)
	if len(rs) != 1 {
		t.Fatalf("prometheusrule.yaml has %d objects", len(rs))
	}
	pr, ok := rs[0].obj.(*prometheusRule)
	if !ok || !reflect.DeepEqual(pr.Spec, loadRules(t)) {
		t.Errorf("prometheusrule.yaml's spec is not %s: run go generate ./deploy", rulesFile)
	}
}

// loadPromConfig reads prometheus/prometheus.yml strictly.
func loadPromConfig(t testing.TB) scrapeConfig {
	t.Helper()
	data, err := os.ReadFile("prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var sc scrapeConfig
	if err := unmarshalStrict(data, &sc); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	if len(sc.ScrapeConfigs) != 1 {
		t.Fatalf("prometheus.yml has %d scrape jobs, want egret's alone", len(sc.ScrapeConfigs))
	}
	return sc
}
