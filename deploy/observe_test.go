package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/proxy/proxytest"
	"github.com/egret-proxy/egret/retry"
)

// family is a metric family egret registers, as a node's /metrics shows it.
type family struct {
	kind   string // counter, gauge, histogram, summary, untyped
	labels map[string]bool
	values map[string]map[string]bool // label values seen after traffic
}

// recorder registers collectors with the registry it wraps and records
// every family they describe, so that a labelled family with no series yet
// (nothing counted) is known too.
type recorder struct {
	prometheus.Registerer
	fams map[string]*family
}

var (
	descNameRE   = regexp.MustCompile(`fqName: "([^"]*)"`)
	descConstRE  = regexp.MustCompile(`constLabels: \{([^}]*)\}`)
	descLabelsRE = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
)

// parseDesc reads a Desc's name and label names from its String(): the
// client library exports nothing else of it.
func parseDesc(d *prometheus.Desc) (string, []string, error) {
	s := d.String()
	n, c, v := descNameRE.FindStringSubmatch(s), descConstRE.FindStringSubmatch(s), descLabelsRE.FindStringSubmatch(s)
	if n == nil || c == nil || v == nil {
		return "", nil, fmt.Errorf("cannot read %s", s)
	}
	var labels []string
	for _, kv := range strings.Split(c[1], ",") {
		if k, _, ok := strings.Cut(kv, "="); ok {
			labels = append(labels, k)
		}
	}
	for _, l := range strings.Split(v[1], ",") {
		if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
			labels = append(labels, l)
		}
	}
	return n[1], labels, nil
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	kind := ""
	switch c.(type) { // a vector's kind; the others' come from Gather
	case *prometheus.CounterVec:
		kind = "counter"
	case *prometheus.GaugeVec:
		kind = "gauge"
	case *prometheus.HistogramVec:
		kind = "histogram"
	case *prometheus.SummaryVec:
		kind = "summary"
	}
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	var err error
	for d := range ch {
		name, labels, perr := parseDesc(d)
		if perr != nil {
			err = perr
			continue
		}
		f := r.fams[name]
		if f == nil {
			f = &family{kind: kind, labels: map[string]bool{}, values: map[string]map[string]bool{}}
			r.fams[name] = f
		}
		for _, l := range labels {
			f.labels[l] = true
		}
	}
	return err
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// merge adds what a registry gathered: kinds, and the label values seen.
func merge(fams map[string]*family, mfs []*dto.MetricFamily) {
	for _, mf := range mfs {
		f := fams[mf.GetName()]
		if f == nil {
			continue
		}
		f.kind = strings.ToLower(mf.GetType().String())
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if f.values[lp.GetName()] == nil {
					f.values[lp.GetName()] = map[string]bool{}
				}
				f.values[lp.GetName()][lp.GetValue()] = true
			}
		}
	}
}

func TestParseDesc(t *testing.T) {
	d := prometheus.NewDesc("egret_x_total", "help, with {braces}", []string{"a", "b"}, prometheus.Labels{"c": "v"})
	name, labels, err := parseDesc(d)
	if err != nil || name != "egret_x_total" || !slices.Equal(labels, []string{"c", "a", "b"}) {
		t.Errorf("parseDesc = %q %q %v", name, labels, err)
	}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// egretFamilies returns the families `egret agent` serves on --metrics,
// registered the way cmd/egret/cli's runAgent registers them (Go and process
// collectors, the policy watcher, the agent with its proxies' and attempt
// runner's metrics), after a pod came up, a pod failed to start and a
// refused source reload; and then the same proxy and runner metrics after
// real requests, for the label values they take.
func egretFamilies(t *testing.T) map[string]*family {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	rec := &recorder{Registerer: reg, fams: map[string]*family{}}
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pfile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pfile, []byte("defaults: {max_attempts: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := policy.NewWatcher(pfile, quiet(), rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	src, err := pods.NewMemory(
		pods.Pod{Name: "web", Cgroup: "/cg/web", ListenPort: freePort(t)},
		pods.Pod{Name: "busy", Cgroup: "/cg/busy", ListenPort: uint16(busy.Addr().(*net.TCPAddr).Port)},
	)
	if err != nil {
		t.Fatal(err)
	}
	fake := agent.NewFake()
	a, err := agent.New(agent.Config{Attacher: fake, Source: src, Policy: w, Registerer: rec,
		Logger: quiet(), RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	waitFor(t, "web running and busy failed", func() bool {
		web, err1 := a.Pod("web")
		b, err2 := a.Pod("busy")
		return err1 == nil && err2 == nil && web.State == agent.StateRunning && b.State == agent.StateFailed
	})
	// The kernel's direct-flow counters for web, so that their families
	// have samples (a Fake's pods make no connects of their own).
	web, _ := a.Pod("web")
	fake.SetFlows([]bpfload.PodFlow{{PodID: web.CgroupID, Path: bpfload.PathLearned,
		Stats: bpfload.FlowStats{Connects: 3, Established: 1, Refused: 1, ResetAfterAck: 1, Retransmits: 2, SegsOut: 9}}})
	a.SourceError(errors.New("refused reload"))
	running, err := reg.Gather() // the flow families are read while the pods run
	if err != nil {
		t.Fatal(err)
	}
	merge(rec.fams, running)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	merge(rec.fams, mfs)

	// Real requests through an explicit-mode proxy with the same units.
	traffic := prometheus.NewPedanticRegistry()
	pm, err := proxy.NewMetrics(traffic)
	if err != nil {
		t.Fatal(err)
	}
	rm, err := retry.NewMetrics(traffic)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse("p.yaml", []byte("defaults: {backoff: {kind: full, base: 1ms, max: 5ms}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	proxytest.Traffic(t, proxy.StaticPolicy{P: pol}, pm, rm)
	tmfs, err := traffic.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range tmfs {
		if rec.fams[mf.GetName()] == nil {
			t.Errorf("traffic counted %s, which `egret agent` does not register", mf.GetName())
		}
	}
	merge(rec.fams, tmfs)
	for name, f := range rec.fams {
		if f.kind == "" {
			t.Fatalf("family %s: kind unknown (a vector of a type the recorder does not know)", name)
		}
	}
	return rec.fams
}

func freePort(t *testing.T) uint16 {
	t.Helper()
	port, err := agent.FreeListenPort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// cond looks at another process's state, which announces nothing.
	testenv.Eventually(t, 10*time.Second, what, cond)
}

// obsConfig is what the checks need to know beside the metric families.
type obsConfig struct {
	fams    map[string]*family
	target  map[string]bool            // labels the scrape job adds to every series
	closed  map[string]map[string]bool // every value some labels can take
	job     string
	records map[string]bool // recording rules' names
}

// scrapeConfig is the part of deploy/prometheus/prometheus.yml egret's
// checks read; decoding is strict.
type scrapeConfig struct {
	Global struct {
		ScrapeInterval     string `json:"scrape_interval"`
		EvaluationInterval string `json:"evaluation_interval"`
	} `json:"global"`
	RuleFiles     []string `json:"rule_files"`
	ScrapeConfigs []struct {
		JobName             string `json:"job_name"`
		KubernetesSDConfigs []struct {
			Role       string `json:"role"`
			Namespaces struct {
				Names []string `json:"names"`
			} `json:"namespaces"`
		} `json:"kubernetes_sd_configs"`
		RelabelConfigs []struct {
			SourceLabels []string `json:"source_labels"`
			Regex        string   `json:"regex,omitempty"`
			Action       string   `json:"action,omitempty"`
			TargetLabel  string   `json:"target_label,omitempty"`
		} `json:"relabel_configs"`
	} `json:"scrape_configs"`
}

// ruleFile is Prometheus's rule file format, decoded strictly.
type ruleFile struct {
	Groups []struct {
		Name     string `json:"name"`
		Interval string `json:"interval,omitempty"`
		Rules    []struct {
			Alert       string            `json:"alert,omitempty"`
			Record      string            `json:"record,omitempty"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

const rulesFile = "prometheus/egret-rules.yaml"

func loadRules(t testing.TB) ruleFile {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := unmarshalStrict(data, &rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return rf
}

// loadObsConfig checks the scrape job against the manifests and returns
// what the dashboard and rule checks need.
func loadObsConfig(t *testing.T) obsConfig {
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
	if !slices.Equal(sc.RuleFiles, []string{filepath.Base(rulesFile)}) {
		t.Errorf("prometheus.yml loads rules %v, want %s", sc.RuleFiles, filepath.Base(rulesFile))
	}
	job := sc.ScrapeConfigs[0]
	cfg := obsConfig{job: job.JobName, target: map[string]bool{"job": true, "instance": true}, records: map[string]bool{}}

	// The job finds the DaemonSet's pods: their namespace, their name label
	// and their metrics port.
	objs := loadManifests(t)
	ns := only[*corev1.Namespace](t, objs)
	ds := only[*appsv1.DaemonSet](t, objs)
	if len(job.KubernetesSDConfigs) != 1 || job.KubernetesSDConfigs[0].Role != "pod" ||
		!slices.Equal(job.KubernetesSDConfigs[0].Namespaces.Names, []string{ns.Name}) {
		t.Errorf("scrape job discovers %+v, want the pods of %s", job.KubernetesSDConfigs, ns.Name)
	}
	kept := false
	for _, rc := range job.RelabelConfigs {
		if rc.TargetLabel != "" {
			cfg.target[rc.TargetLabel] = true
		}
		if rc.Action == "keep" && slices.Equal(rc.SourceLabels, []string{"__meta_kubernetes_pod_label_app_kubernetes_io_name", "__meta_kubernetes_pod_container_port_name"}) {
			name := ds.Spec.Template.Labels["app.kubernetes.io/name"]
			kept = regexp.MustCompile("^(?:" + rc.Regex + ")$").MatchString(name + ";metrics")
		}
	}
	if !kept {
		t.Error("the scrape job does not keep the DaemonSet's pods on their metrics port")
	}
	if !cfg.target["node"] {
		t.Error("the scrape job does not set the node label the dashboard and alerts group by")
	}

	cfg.fams = egretFamilies(t)
	// Label values egret's code enumerates: the checks refuse any other.
	set := func(vs ...string) map[string]bool {
		m := map[string]bool{}
		for _, v := range vs {
			m[v] = true
		}
		return m
	}
	var reasons, categories []string
	for r := engine.Reason(1); !strings.HasPrefix(r.String(), "reason("); r++ {
		reasons = append(reasons, r.String())
	}
	for _, c := range engine.Categories() {
		categories = append(categories, c.String())
	}
	categories = append(categories, engine.CategoryNone.String())
	outcomes := set(engine.OutcomeNotSent.String(), engine.OutcomeFailed.String(), engine.OutcomeAmbiguous.String())
	for _, f := range []string{"egret_proxy_requests_total", "egret_retry_outcomes_total"} {
		for v := range cfg.fams[f].values["outcome"] {
			outcomes[v] = true
		}
	}
	cfg.closed = map[string]map[string]bool{
		"decision": set(engine.Deny.String(), engine.Retry.String(), engine.Ambiguous.String()),
		"reason":   set(reasons...),
		"category": set(categories...),
		"state":    set(agent.StateRunning, agent.StateFailed),
		"kind":     set(pods.Added.String(), pods.Updated.String(), pods.Removed.String(), pods.Synced.String()),
		"result":   cfg.fams["egret_policy_reloads_total"].values["result"],
		"outcome":  outcomes,
		"job":      set(cfg.job),
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				cfg.records[r.Record] = true
			}
		}
	}
	return cfg
}

// promSynthesized are series Prometheus makes for each target itself.
var promSynthesized = map[string]bool{"up": true}

// checkExpr checks one PromQL expression: every metric it selects is one
// egret registers (histograms through _bucket, _sum and _count), every
// label it matches or groups by exists, every value it matches a closed
// label with is one egret uses. It returns the expression's references.
func (cfg obsConfig) checkExpr(expr string) (refs, []error) {
	r, err := parseRefs(expr)
	if err != nil {
		return r, []error{err}
	}
	var errs []error
	if len(r.selectors) == 0 {
		errs = append(errs, errors.New("selects no metric"))
	}
	available := map[string]bool{}
	for l := range cfg.target {
		available[l] = true
	}
	for _, s := range r.selectors {
		labels, ok := cfg.labelsOf(s.name)
		if !ok {
			errs = append(errs, fmt.Errorf("metric %q is not one egret registers", s.name))
			continue
		}
		for l := range labels {
			available[l] = true
		}
		for _, m := range s.matchers {
			if !labels[m.label] && m.label != "__name__" {
				errs = append(errs, fmt.Errorf("%s has no label %q", s.name, m.label))
				continue
			}
			if vals := cfg.closed[m.label]; vals != nil && (m.op == "=" || m.op == "!=") && !vals[m.value] {
				errs = append(errs, fmt.Errorf("%s{%s%s%q}: %q is not a value egret gives %s (%v)", s.name, m.label, m.op, m.value, m.value, m.label, sortedKeys(vals)))
			}
		}
	}
	for _, l := range r.grouping {
		if !available[l] {
			errs = append(errs, fmt.Errorf("grouping label %q is on none of the metrics selected", l))
		}
	}
	return r, errs
}

// labelsOf returns the labels series of a name carry, scrape labels
// included, and whether egret (or Prometheus, or a recording rule) makes
// such series.
func (cfg obsConfig) labelsOf(name string) (map[string]bool, bool) {
	labels := map[string]bool{}
	for l := range cfg.target {
		labels[l] = true
	}
	if promSynthesized[name] || cfg.records[name] {
		return labels, true
	}
	add := func(f *family, extra ...string) map[string]bool {
		for l := range f.labels {
			labels[l] = true
		}
		for _, l := range extra {
			labels[l] = true
		}
		return labels
	}
	if f := cfg.fams[name]; f != nil && f.kind != "histogram" {
		if f.kind == "summary" {
			return add(f, "quantile"), true
		}
		return add(f), true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if f := cfg.fams[base]; f != nil && (f.kind == "histogram" || f.kind == "summary" && suffix != "_bucket") {
			if suffix == "_bucket" {
				return add(f, "le"), true
			}
			return add(f), true
		}
	}
	return nil, false
}

func sortedKeys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// The checks themselves must catch what they are for.
func TestCheckExprCatchesMistakes(t *testing.T) {
	cfg := loadObsConfig(t)
	for _, ok := range []string{
		`sum by (node, outcome) (rate(egret_proxy_requests_total{outcome="ambiguous", job="egret"}[5m]))`,
		`histogram_quantile(0.9, sum by (le) (rate(egret_agent_pod_start_seconds_bucket[5m])))`,
		`rate(egret_agent_pod_start_seconds_count[5m]) + go_gc_duration_seconds{quantile="0.5"}`,
		`up{job="egret", node="a"} == 0`,
	} {
		if _, errs := cfg.checkExpr(ok); len(errs) > 0 {
			t.Errorf("%s: %v", ok, errs)
		}
	}
	for _, bad := range []string{
		`rate(egret_proxy_request_total[5m])`,                                // misspelt metric
		`egret_agent_pod_start_seconds`,                                      // a histogram has no bare series
		`egret_proxy_requests_total{outcom="ambiguous"}`,                     // misspelt label
		`egret_proxy_requests_total{outcome="not_sent"}`,                     // the value is not-sent
		`egret_retry_decisions_total{decision="deny", reason="budget"}`,      // no such reason
		`sum by (upstream) (egret_proxy_requests_total)`,                     // not a label of it
		`egret_agent_pods{state="Running"}`,                                  // values are lower case
		`rate(egret_agent_pod_start_seconds_bucket{quantile="0.5"}[5m])`,     // le, not quantile
		`up{job="egret-agent"}`,                                              // not the scrape job
		`sum(rate(egret_proxy_requests_total[5m])`,                           // unbalanced
		`egret_proxy_requests_total{node=~"$node"} / egret_no_such_metric{}`, // one bad of two
	} {
		if _, errs := cfg.checkExpr(bad); len(errs) == 0 {
			t.Errorf("%s: no error", bad)
		}
	}
}

const dashboardFile = "dashboards/egret-node.json"

func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Error("dashboard without uid or title")
	}
	cfg := loadObsConfig(t)

	vars := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
		switch v.Type {
		case "datasource":
			var q string
			if err := json.Unmarshal(v.Query, &q); err != nil || q != "prometheus" {
				t.Errorf("variable %s: query %s, want prometheus", v.Name, v.Query)
			}
		case "query":
			var q struct{ Query string }
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Errorf("variable %s: %v", v.Name, err)
				continue
			}
			m := regexp.MustCompile(`^label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`).FindStringSubmatch(q.Query)
			if m == nil {
				t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, q.Query)
				continue
			}
			r, errs := cfg.checkExpr(m[1])
			for _, err := range errs {
				t.Errorf("variable %s: %v", v.Name, err)
			}
			for _, s := range r.selectors {
				if labels, _ := cfg.labelsOf(s.name); !labels[m[2]] {
					t.Errorf("variable %s: %s has no label %s", v.Name, s.name, m[2])
				}
			}
		default:
			t.Errorf("variable %s of type %s: the test does not know it", v.Name, v.Type)
		}
	}
	if !vars["datasource"] {
		t.Fatal("no datasource variable")
	}

	ids := map[int]bool{}
	exprs := 0
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, g)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			if p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: datasource %q, want ${datasource}", p.Title, p.Datasource.UID)
			}
			refIDs := map[string]bool{}
			for _, tg := range p.Targets {
				if refIDs[tg.RefID] || tg.RefID == "" {
					t.Errorf("panel %q: refId %q empty or repeated", p.Title, tg.RefID)
				}
				refIDs[tg.RefID] = true
				for _, v := range regexp.MustCompile(`\$\{?([A-Za-z0-9_]+)`).FindAllStringSubmatch(tg.Expr, -1) {
					if !vars[v[1]] {
						t.Errorf("panel %q: $%s is no variable of the dashboard", p.Title, v[1])
					}
				}
				exprs++
				if _, errs := cfg.checkExpr(tg.Expr); len(errs) > 0 {
					t.Errorf("panel %q, %s: %v", p.Title, tg.Expr, errs)
				}
			}
		}
	}
	walk(dash.Panels)
	if exprs == 0 {
		t.Fatal("no query in the dashboard")
	}
	t.Logf("%d panel queries checked against %d metric families", exprs, len(cfg.fams))
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ X, Y, W, H int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

func TestAlertRules(t *testing.T) {
	rf := loadRules(t)
	cfg := loadObsConfig(t)
	names := map[string]bool{}
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			id := r.Alert + r.Record
			if (r.Alert == "") == (r.Record == "") {
				t.Errorf("rule %q: exactly one of alert and record", id)
			}
			if names[id] {
				t.Errorf("rule %s defined twice", id)
			}
			names[id] = true
			n++
			ref, errs := cfg.checkExpr(r.Expr)
			for _, err := range errs {
				t.Errorf("%s: %v", id, err)
			}
			if r.Alert == "" {
				continue
			}
			if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" && sev != "info" {
				t.Errorf("%s: severity %q", id, sev)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary", id)
			}
			// {{ $labels.x }} in the annotations must be a label the alert's
			// series keep: the grouping labels of an aggregation, else the
			// selected series' own.
			keep := map[string]bool{}
			for _, l := range ref.grouping {
				keep[l] = true
			}
			if len(keep) == 0 {
				for _, s := range ref.selectors {
					labels, _ := cfg.labelsOf(s.name)
					for l := range labels {
						keep[l] = true
					}
				}
			}
			for _, a := range r.Annotations {
				for _, m := range regexp.MustCompile(`\$labels\.([A-Za-z_][A-Za-z0-9_]*)`).FindAllStringSubmatch(a, -1) {
					if !keep[m[1]] {
						t.Errorf("%s: annotation uses $labels.%s, which the alert's series do not have", id, m[1])
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules")
	}

	// Prometheus's own check, where its promtool is installed.
	promtool, err := exec.LookPath("promtool")
	testenv.Require(t, err == nil, "promtool (Debian package prometheus) to check the rules as Prometheus loads them")
	out, err := exec.Command(promtool, "check", "rules", rulesFile).CombinedOutput()
	if err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("SUCCESS: %d rules found", n); !strings.Contains(string(out), want) {
		t.Errorf("promtool says %q, want %q", out, want)
	}
}
