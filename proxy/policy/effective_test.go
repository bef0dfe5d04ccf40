package policy

import (
	"slices"
	"testing"
)

// Fields tells each resolved field's value and the layer it came from:
// the embedded defaults, the file's defaults, the entry, a pod override's
// defaults or entry; the budget name of an unnamed destination is the
// destination's.
func TestFieldsSayWhereEachValueCameFrom(t *testing.T) {
	dir := t.TempDir()
	node := writeFile(t, dir, "node.yaml", `defaults:
  timeout: 5s
upstreams:
  - host: api.test
    port: 443
    max_attempts: 4
    backoff: {kind: decorrelated}
`)
	base, err := Load(node)
	if err != nil {
		t.Fatal(err)
	}
	field := func(u *Upstream, name string) Field {
		t.Helper()
		fs := u.Fields()
		i := slices.IndexFunc(fs, func(f Field) bool { return f.Name == name })
		if i < 0 {
			t.Fatalf("no field %s in %+v", name, fs)
		}
		return fs[i]
	}
	want := func(u *Upstream, name string, value any, from, file string, line int) {
		t.Helper()
		f := field(u, name)
		if f.Value != value || f.From != from || f.File != file || f.Line != line {
			t.Errorf("%s of %s: %+v; want %v from %s at %s:%d", name, u.Pattern(), f, value, from, file, line)
		}
	}
	api := base.Match("api.test", 443)
	if api.Pattern() != "api.test:443" || api.Name != "api.test:443" {
		t.Fatalf("entry %s, name %s", api.Pattern(), api.Name)
	}
	want(api, "max_attempts", 4, FromEntry, node, 6)
	want(api, "backoff.kind", "decorrelated", FromEntry, node, 7)
	want(api, "timeout", "5s", FromDefaults, node, 2)
	want(api, "min_attempt", "50ms", FromBuiltin, "", 0)
	want(api, "name", "api.test:443", FromEntry, node, 4)

	other := base.Match("other.test", 8080)
	if other.Pattern() != "defaults" {
		t.Fatalf("other.test matched %s", other.Pattern())
	}
	want(other, "name", "other.test:8080", FromDestination, "", 0)
	want(other, "max_attempts", 3, FromBuiltin, "", 0)
	want(other, "timeout", "5s", FromDefaults, node, 2)

	pod, err := Overlay(base, "pod ns1/web", []byte(`defaults:
  min_attempt: 100ms
upstreams:
  - host: api.test
    port: 443
    max_attempts: 2
`))
	if err != nil {
		t.Fatal(err)
	}
	api = pod.Match("api.test", 443)
	want(api, "max_attempts", 2, FromPodEntry, "pod ns1/web", 6)
	want(api, "backoff.kind", "decorrelated", FromEntry, node, 7)
	want(api, "min_attempt", "100ms", FromPodDefaults, "pod ns1/web", 2)
	want(api, "timeout", "5s", FromDefaults, node, 2)

	// Every field a file can set is reported, once.
	ex, _ := loadExample(t)
	names := map[string]bool{}
	for _, f := range fields {
		if names[f.name] {
			t.Errorf("field %s reported twice", f.name)
		}
		names[f.name] = true
	}
	for _, u := range append([]*Upstream{ex.Defaults}, ex.Upstreams...) {
		for name := range u.origins {
			if !names[name] {
				t.Errorf("%s sets %s, which Fields does not report", u.Pattern(), name)
			}
		}
	}
}
