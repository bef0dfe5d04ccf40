// Command copies writes the copies of egret's alert rules and node
// dashboard that the kustomize components and the Helm chart carry, and
// the chart's copy of the node policy's default text (its template tells
// the policy value left at its default from one set):
// neither kustomize (its load restrictor) nor Helm (.Files) reads a file
// outside its own directory. deploy's tests check that every copy is the
// same as its source.
//
//	go generate ./deploy     # runs: go run ./copies (in deploy/)
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// Sources, relative to deploy/.
const (
	rules     = "prometheus/egret-rules.yaml"
	dashboard = "dashboards/egret-node.json"
	policy    = "kubernetes/policy.yaml" // a ConfigMap: its data's policy.yaml
)

// ruleHeader opens the PrometheusRule of the kustomize component; the rule
// file follows under spec, indented.
const ruleHeader = `# egret's alert rules for the Prometheus Operator: deploy/prometheus/egret-rules.yaml
# under spec, written by ` + "`go generate ./deploy`" + ` (deploy/copies); do not edit.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: egret
  namespace: egret-system
  labels:
    app.kubernetes.io/name: egret
    app.kubernetes.io/part-of: egret
spec:
`

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "copies:", err)
		os.Exit(1)
	}
}

func run() error {
	r, err := os.ReadFile(rules)
	if err != nil {
		return err
	}
	d, err := os.ReadFile(dashboard)
	if err != nil {
		return err
	}
	cm, err := os.ReadFile(policy)
	if err != nil {
		return err
	}
	var pol struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(cm, &pol); err != nil {
		return fmt.Errorf("%s: %w", policy, err)
	}
	if pol.Data["policy.yaml"] == "" {
		return fmt.Errorf("%s: no data policy.yaml", policy)
	}
	var pr bytes.Buffer
	pr.WriteString(ruleHeader)
	for _, line := range bytes.SplitAfter(r, []byte("\n")) {
		if len(bytes.TrimSpace(line)) > 0 {
			pr.WriteString("  ")
		}
		pr.Write(line)
	}
	out := map[string][]byte{
		"kubernetes/components/prometheusrule/prometheusrule.yaml": pr.Bytes(),
		"kubernetes/components/dashboard/egret-node.json":          d,
		"helm/egret/files/egret-rules.yaml":                        r,
		"helm/egret/files/egret-node.json":                         d,
		"helm/egret/files/default-policy.yaml":                     []byte(pol.Data["policy.yaml"]),
	}
	for f, data := range out {
		if old, err := os.ReadFile(f); err == nil && bytes.Equal(old, data) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f, data, 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", f)
	}
	return nil
}
