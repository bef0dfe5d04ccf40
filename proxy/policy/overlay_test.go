package policy

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestOverlay(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "token", "node-token")
	base, err := Load(writeFile(t, dir, "node.yaml", `defaults:
  max_attempts: 3
upstreams:
  - host: api.test
    port: 443
    timeout: 5s
    tls: {enabled: true}
    credential: {bearer_token_file: token}
  - host: b.test
    max_attempts: 5
    routes: [{method: POST, path_prefix: /q, idempotent: true}]
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Overlay(base, "pod-a", []byte(`defaults:
  max_attempts: 2
  method_default: off
upstreams:
  - host: b.test
    max_attempts: 1
  - host: c.test
    port: 80
    attempt_timeout: 1s
`))
	if err != nil {
		t.Fatal(err)
	}
	api, b, c, other := p.Match("api.test", 443), p.Match("b.test", 8080), p.Match("c.test", 80), p.Match("d.test", 80)
	// The override's defaults reach a base entry that does not set the field.
	if api.MaxAttempts != 2 || api.MethodDefault || api.Timeout != 5*time.Second {
		t.Errorf("api.test: %+v", api)
	}
	// The node's credential and TLS are kept.
	if api.Refresher() == nil || api.Refresher().Token() != "node-token" || api.TLSConfig() == nil || api.Name != "api.test:443" {
		t.Errorf("api.test lost node settings: %+v", api)
	}
	// An override entry refines the base entry field by field.
	if b.MaxAttempts != 1 || len(b.Routes) != 1 || b.Name != "b.test:8080" {
		t.Errorf("b.test: %+v", b)
	}
	if c.MaxAttempts != 2 || c.AttemptTimeout != time.Second || c.Name != "c.test:80" {
		t.Errorf("c.test: %+v", c)
	}
	if other.MaxAttempts != 2 || other.MethodDefault {
		t.Errorf("unmatched: %+v", other)
	}
	if !strings.Contains(p.Source, "node.yaml") || !strings.Contains(p.Source, "pod-a") {
		t.Errorf("source %q", p.Source)
	}
	// The base is not changed.
	if base.Match("api.test", 443).MaxAttempts != 3 || base.Match("b.test", 1).MaxAttempts != 5 || !base.Match("d.test", 1).MethodDefault {
		t.Error("Overlay changed its base")
	}
	if len(base.Upstreams) != 2 {
		t.Errorf("base has %d entries", len(base.Upstreams))
	}
	// Overlays do not pile up: a second pod's override starts from the base.
	q, err := Overlay(base, "pod-b", []byte("defaults: {max_attempts: 4}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if q.Match("c.test", 80).Host != "" || q.Match("api.test", 443).MaxAttempts != 4 {
		t.Errorf("pod-b sees pod-a's override")
	}
	// The embedded defaults can be overlaid too.
	e, err := Overlay(Default(), "pod-c", []byte("upstreams: [{host: x.test, max_attempts: 1}]\n"))
	if err != nil || e.Match("x.test", 1).MaxAttempts != 1 || e.Match("y.test", 1).MaxAttempts != 3 {
		t.Errorf("overlay of defaults: %v", err)
	}
}

func TestOverlayRefusals(t *testing.T) {
	base, err := Parse("node.yaml", []byte("upstreams:\n  - host: api.test\n    timeout: 5s\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		yaml string
		at   string
		err  error
	}{
		{"defaults:\n  budget: {ratio: 5}\n", "pod.yaml:2:11: defaults.budget", ErrNotOverridable},
		{"upstreams:\n  - host: api.test\n    credential:\n      refresh_command: [/bin/sh]\n", "pod.yaml:4:7: upstreams[0].credential", ErrNotOverridable},
		{"upstreams:\n  - host: api.test\n    tls: {enabled: true, ca_file: /etc/shadow}\n", "pod.yaml:3:10: upstreams[0].tls", ErrNotOverridable},
		{"defaults:\n  bulkhead: 1000\n", "pod.yaml:2:13: defaults.bulkhead", ErrNotOverridable},
		{"defaults:\n  body: {memory_limit: 1GiB}\n", "pod.yaml:2:9: defaults.body", ErrNotOverridable},
		{"upstreams:\n  - host: api.test\n    name: fresh-budget\n", "pod.yaml:3:11: upstreams[0].name", ErrNotOverridable},
		{"direct:\n  ports: [443]\n", "pod.yaml:2:3: direct", ErrNotOverridable},
		// A contradiction with the base is reported in the override.
		{"upstreams:\n  - host: api.test\n    attempt_timeout: 6s\n", "pod.yaml:3:22: upstreams[0].attempt_timeout", ErrConflict},
		{"defaults:\n  max_attempts: 0\n", "pod.yaml:2:17: defaults.max_attempts", ErrInvalid},
		{"upstreams:\n  - {host: a.test, port: 1}\n  - {host: a.test, port: 1}\n", "pod.yaml:3:12: upstreams[1].host", ErrDuplicate},
		// New entries name one destination; wildcards are the node's.
		{"upstreams:\n  - host: a.test\n", "pod.yaml:2:11: upstreams[0].host", ErrNotOverridable},
		{"upstreams:\n  - {host: \"*.a.test\", port: 80}\n", "pod.yaml:2:12: upstreams[0].host", ErrNotOverridable},
	} {
		_, err := Overlay(base, "pod.yaml", []byte(c.yaml))
		if !errors.Is(err, c.err) || err == nil || !strings.HasPrefix(err.Error(), c.at+": ") {
			t.Errorf("%q: got %v, want %v at %s", c.yaml, err, c.err, c.at)
		}
	}
}

// A pod's new entry for one destination refines what the node's policy does
// for that destination: its TLS, credential, budget name and budget stay.
func TestOverlayNewEntryKeepsNodeSettings(t *testing.T) {
	dir := t.TempDir()
	newPKI(t, dir)
	writeFile(t, dir, "token", "node-token")
	base, err := Load(writeFile(t, dir, "node.yaml", `upstreams:
  - host: "*.corp.test"
    name: corp
    max_attempts: 4
    budget: {ratio: 0.5}
    bulkhead: 7
    tls: {enabled: true, ca_file: ca.pem}
    credential: {bearer_token_file: token}
  - host: plain.test
    max_attempts: 2
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Overlay(base, "pod.yaml", []byte(`upstreams:
  - host: api.corp.test
    port: 443
    attempt_timeout: 1s
  - host: plain.test
    port: 8080
    max_attempts: 1
`))
	if err != nil {
		t.Fatal(err)
	}
	u, b := p.Match("api.corp.test", 443), base.Match("api.corp.test", 443)
	if u.AttemptTimeout != time.Second || u.MaxAttempts != 4 {
		t.Errorf("override not applied: %+v", u)
	}
	if u.Name != b.Name || u.Name != "corp" || u.Budget != b.Budget || u.Bulkhead != 7 ||
		u.TLSConfig() == nil || u.TLSConfig().RootCAs == nil || u.Refresher() == nil || u.Refresher().Token() != "node-token" {
		t.Errorf("node settings lost: %+v (base %+v)", u, b)
	}
	// Other hosts under the wildcard are not touched.
	if o := p.Match("www.corp.test", 443); o.AttemptTimeout != 0 || o.Name != "corp" {
		t.Errorf("www.corp.test: %+v", o)
	}
	// A port-less base entry refined for one port: the name is the
	// destination's, as the base would give it.
	pl, bpl := p.Match("plain.test", 8080), base.Match("plain.test", 8080)
	if pl.MaxAttempts != 1 || pl.Name != bpl.Name || pl.Name != "plain.test:8080" {
		t.Errorf("plain.test:8080 %+v", pl)
	}
	if o := p.Match("plain.test", 80); o.MaxAttempts != 2 {
		t.Errorf("plain.test:80 %+v", o)
	}
	// An overlay of an overlay resolves the same way.
	q, err := Overlay(p, "pod2.yaml", []byte("defaults: {max_attempts: 3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if u := q.Match("api.corp.test", 443); u.AttemptTimeout != time.Second || u.Name != "corp" || u.TLSConfig() == nil {
		t.Errorf("overlay of overlay: %+v", u)
	}
}
