package deploy

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// podMonitor is the part of the Prometheus Operator's PodMonitor
// (monitoring.coreos.com/v1) that egret uses, decoded strictly: a field
// added to the manifests must be added here.
type podMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		JobLabel            string               `json:"jobLabel"`
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Interval    string `json:"interval,omitempty"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
			} `json:"relabelings"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// prometheusRule is the Prometheus Operator's PrometheusRule: a rule file
// under spec.
type prometheusRule struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            ruleFile          `json:"spec"`
}

// rendered is one object of a helm or kustomize rendering: a typed
// k8s.io/api object, or a PodMonitor or PrometheusRule.
type rendered struct {
	kind, namespace, name string
	obj                   any
}

func (r rendered) key() string { return r.kind + " " + r.namespace + "/" + r.name }

// decodeRendered decodes a multi-document YAML stream strictly: the API's
// types with the API server's strict decoder, the Prometheus Operator's
// two kinds into podMonitor and prometheusRule.
func decodeRendered(t testing.TB, what string, data []byte) []rendered {
	t.Helper()
	docs, err := splitDocs(data)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	var out []rendered
	for i, d := range docs {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(d, &tm); err != nil {
			t.Fatalf("%s, document %d: %v", what, i+1, err)
		}
		var r rendered
		var meta metav1.ObjectMeta
		switch tm.APIVersion + " " + tm.Kind {
		case "monitoring.coreos.com/v1 PodMonitor":
			var pm podMonitor
			err = unmarshalStrict(d, &pm)
			r.obj, meta = &pm, pm.Metadata
		case "monitoring.coreos.com/v1 PrometheusRule":
			var pr prometheusRule
			err = unmarshalStrict(d, &pr)
			r.obj, meta = &pr, pr.Metadata
		default:
			var obj runtime.Object
			obj, err = strictDecode(d)
			if obj == nil && err == nil {
				continue
			}
			if err == nil {
				r.obj = obj
				m, merr := metaOf(obj)
				if merr != nil {
					t.Fatal(merr)
				}
				meta = metav1.ObjectMeta{Name: m.GetName(), Namespace: m.GetNamespace()}
			}
		}
		if err != nil {
			t.Fatalf("%s, document %d (%s %s): %v", what, i+1, tm.APIVersion, tm.Kind, err)
		}
		r.kind, r.namespace, r.name = tm.Kind, meta.Namespace, meta.Name
		out = append(out, r)
	}
	return out
}

// sameObject compares two objects field by field and returns where they
// differ, naming a's value and b's.
func sameObject(a, b any) ([]string, error) {
	var x, y any
	for _, p := range []struct {
		in  any
		out *any
	}{{a, &x}, {b, &y}} {
		js, err := yaml.Marshal(p.in)
		if err != nil {
			return nil, err
		}
		if err := yaml.Unmarshal(js, p.out); err != nil {
			return nil, err
		}
	}
	var diffs []string
	diffValues(x, y, "", &diffs)
	return diffs, nil
}

// diffValues appends where the decoded JSON values a and b differ.
func diffValues(a, b any, at string, diffs *[]string) {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		var keys []string
		for k := range am {
			keys = append(keys, k)
		}
		for k := range bm {
			if _, ok := am[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			diffValues(am[k], bm[k], at+"."+k, diffs)
		}
		return
	}
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok && bok && len(as) == len(bs) {
		for i := range as {
			diffValues(as[i], bs[i], fmt.Sprintf("%s[%d]", at, i), diffs)
		}
		return
	}
	if !reflect.DeepEqual(a, b) {
		*diffs = append(*diffs, fmt.Sprintf("%s: %v against %v", at, a, b))
	}
}
