package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each bad file must be refused with the exact line, column and field of
// the problem, the right sentinel and a message that says why.
func TestBadFiles(t *testing.T) {
	dir := t.TempDir()
	keys := newPKI(t, dir)
	token := writeFile(t, dir, "token", "tok\n")
	emptyToken := writeFile(t, dir, "empty-token", "  \n")
	notPEM := writeFile(t, dir, "not.pem", "hello\n")
	missing := filepath.Join(dir, "missing.pem")

	cases := []struct {
		name string
		yaml string
		at   string // "line:col path"
		err  error
		msg  string
	}{
		{"syntax", "defaults:\n  max_attempts: 3\n   timeout: 1s\n", "3:0 ", ErrSyntax, "mapping values are not allowed"},
		{"two documents", "defaults: {}\n---\nupstreams: []\n", "2:1 ", ErrSyntax, "more than one YAML document"},
		{"top level list", "- a\n", "1:1 ", ErrInvalid, "want a mapping"},
		{"unknown top", "defaults: {}\nupstream: []\n", "2:1 upstream", ErrUnknownField, "want one of defaults, deny_destinations, direct, upstreams"},
		{"unknown nested", "upstreams:\n  - host: a.test\n    backoff:\n      kind: full\n      jitter: 1\n", "5:7 upstreams[0].backoff.jitter", ErrUnknownField, "unknown field"},
		{"duplicate key", "defaults:\n  max_attempts: 2\n  max_attempts: 3\n", "3:3 defaults.max_attempts", ErrDuplicate, "first at line 2"},
		{"backoff kind", "upstreams:\n  - host: a.test\n  - host: b.test\n    backoff:\n      kind: jitter\n", "5:13 upstreams[1].backoff.kind", ErrInvalid, `"jitter" is not full or decorrelated`},
		{"max_attempts 0", "defaults:\n  max_attempts: 0\n", "2:17 defaults.max_attempts", ErrInvalid, "0 is out of range [1, 100]"},
		{"max_attempts string", "defaults:\n  max_attempts: \"3\"\n", "2:17 defaults.max_attempts", ErrInvalid, `want an integer, got "3"`},
		{"max_attempts float", "defaults:\n  max_attempts: 2.5\n", "2:17 defaults.max_attempts", ErrInvalid, "want an integer, got 2.5"},
		{"null value", "defaults:\n  timeout:\n", "2:11 defaults.timeout", ErrInvalid, "got nothing"},
		{"duration unit", "defaults:\n  timeout: 15\n", "2:12 defaults.timeout", ErrInvalid, "has no unit"},
		{"duration garbage", "defaults:\n  timeout: soon\n", "2:12 defaults.timeout", ErrInvalid, "is not a duration"},
		{"duration negative", "defaults:\n  min_attempt: -5ms\n", "2:16 defaults.min_attempt", ErrInvalid, "negative"},
		{"duration huge", "defaults:\n  timeout: 48h\n", "2:12 defaults.timeout", ErrInvalid, "longer than 24h"},
		{"backoff base zero", "defaults:\n  backoff: {base: 0s}\n", "2:19 defaults.backoff.base", ErrInvalid, "more than 0"},
		{"ratio negative", "defaults:\n  budget:\n    ratio: -0.1\n", "3:12 defaults.budget.ratio", ErrInvalid, "negative"},
		{"ratio nan", "defaults:\n  budget:\n    ratio: .nan\n", "3:12 defaults.budget.ratio", ErrInvalid, "not a finite number"},
		{"ttl zero", "defaults:\n  budget:\n    ttl: 0s\n", "3:10 defaults.budget.ttl", ErrInvalid, "more than 0"},
		{"bulkhead negative", "upstreams:\n  - host: a.test\n    bulkhead: -1\n", "3:15 upstreams[0].bulkhead", ErrInvalid, "out of range"},
		{"port range", "upstreams:\n  - host: a.test\n    port: 70000\n", "3:11 upstreams[0].port", ErrInvalid, "out of range [1, 65535]"},
		{"host missing", "upstreams:\n  - port: 80\n", "2:5 upstreams[0]", ErrInvalid, "host is required"},
		{"host bad wildcard", "upstreams:\n  - host: \"a.*.test\"\n", "2:11 upstreams[0].host", ErrInvalid, "wildcard must be the whole first label"},
		{"host bad", "upstreams:\n  - host: \"a b\"\n", "2:11 upstreams[0].host", ErrInvalid, "is not a host name"},
		{"host under defaults", "defaults:\n  host: a.test\n", "2:3 defaults.host", ErrUnknownField, "unknown field"},
		{"credential under defaults", "defaults:\n  credential:\n    bearer_token_file: t\n", "3:5 defaults.credential", ErrUnknownField, "sent to every destination"},
		{"server_name under defaults", "defaults:\n  tls:\n    enabled: true\n    server_name: a.test\n", "4:18 defaults.tls.server_name", ErrUnknownField, "set it per upstream"},
		{"duplicate upstream", "upstreams:\n  - host: a.test\n    port: 443\n  - host: b.test\n  - host: A.TEST.\n    port: 443\n", "5:11 upstreams[2].host", ErrDuplicate, "already matched by upstreams[0] (line 2)"},
		{"duplicate wildcard", "upstreams:\n  - host: \"*.x.test\"\n  - host: \"*.X.test\"\n", "3:11 upstreams[1].host", ErrDuplicate, "*.x.test is already matched"},
		{"protocol", "defaults:\n  protocol: http3\n", "2:13 defaults.protocol", ErrInvalid, `"http3" is not http1, h2, h2c or auto`},
		{"method_default", "defaults:\n  method_default: maybe\n", "2:19 defaults.method_default", ErrInvalid, "is not on or off"},
		{"honours bool", "defaults:\n  honours_idempotency_key: yes\n", "2:28 defaults.honours_idempotency_key", ErrInvalid, "want true or false"},
		{"size unit", "defaults:\n  body:\n    memory_limit: 64XB\n", "3:19 defaults.body.memory_limit", ErrInvalid, "unknown unit"},
		{"size huge", "defaults:\n  body:\n    spool_limit: 2GiB\n", "3:18 defaults.body.spool_limit", ErrInvalid, "more than 1GiB"},
		{"transient 4xx", "defaults:\n  transient_statuses: [500, 429]\n", "2:29 defaults.transient_statuses[1]", ErrInvalid, "not a 5xx status"},
		{"transient 503", "defaults:\n  transient_statuses:\n    - 503\n", "3:7 defaults.transient_statuses[0]", ErrInvalid, "always retried"},
		{"transient twice", "defaults:\n  transient_statuses: [500, 507, 500]\n", "2:34 defaults.transient_statuses[2]", ErrDuplicate, "first at line 2"},
		{"route method", "defaults:\n  routes:\n    - method: \"GE T\"\n      path_prefix: /\n      idempotent: true\n", "3:15 defaults.routes[0].method", ErrInvalid, "not an HTTP method"},
		{"route method case", "defaults:\n  routes:\n    - {method: post, path_prefix: /, idempotent: true}\n", "3:16 defaults.routes[0].method", ErrInvalid, "write POST"},
		{"route prefix slash", "defaults:\n  routes:\n    - {method: GET, path_prefix: api, idempotent: true}\n", "3:34 defaults.routes[0].path_prefix", ErrInvalid, "does not start with /"},
		{"route prefix query", "defaults:\n  routes:\n    - {method: GET, path_prefix: \"/a?b\", idempotent: true}\n", "3:34 defaults.routes[0].path_prefix", ErrInvalid, "query"},
		{"route prefix unclean", "defaults:\n  routes:\n    - {method: GET, path_prefix: /a//b/../c, idempotent: true}\n", "3:34 defaults.routes[0].path_prefix", ErrInvalid, `write "/a/c"`},
		{"route missing idempotent", "defaults:\n  routes:\n    - method: GET\n      path_prefix: /a\n", "3:7 defaults.routes[0]", ErrInvalid, "idempotent is required"},
		{"route duplicate", "defaults:\n  routes:\n    - {method: GET, path_prefix: /a, idempotent: true}\n    - {method: GET, path_prefix: /a, idempotent: false}\n", "4:7 defaults.routes[1]", ErrDuplicate, "first at line 3"},
		{"route unknown", "defaults:\n  routes:\n    - {method: GET, path_prefix: /a, prefx: /a, idempotent: true}\n", "3:38 defaults.routes[0].prefx", ErrUnknownField, "path_prefix"},
		{"empty path", "upstreams:\n  - host: a.test\n    tls: {enabled: true, ca_file: \"\"}\n", "3:35 upstreams[0].tls.ca_file", ErrInvalid, "empty path"},
		{"bad name", "upstreams:\n  - host: a.test\n    name: \"my budget\"\n", "3:11 upstreams[0].name", ErrInvalid, "without spaces"},
		{"bad server_name", "upstreams:\n  - host: a.test\n    tls: {enabled: true, server_name: \"a..b\"}\n", "3:39 upstreams[0].tls.server_name", ErrInvalid, "not a host name"},
		{"key not a word", "defaults:\n  [a]: 1\n", "2:3 defaults", ErrInvalid, "a key must be a plain word"},
		{"refresh command empty", "upstreams:\n  - host: a.test\n    credential:\n      bearer_token_file: " + token + "\n      refresh_command: []\n", "5:24 upstreams[0].credential.refresh_command", ErrInvalid, "empty command"},
		{"direct unknown", "direct:\n  port: [9000]\n", "2:3 direct.port", ErrUnknownField, "want one of cidrs, default_ports, learn, ports"},
		{"direct port range", "direct:\n  ports: [9000, 0]\n", "2:17 direct.ports[1]", ErrInvalid, "0 is out of range [1, 65535]"},
		{"direct port string", "direct:\n  ports: [\"http\"]\n", "2:11 direct.ports[0]", ErrInvalid, `want an integer, got "http"`},
		{"direct port twice", "direct:\n  ports: [9000, 9000]\n", "2:17 direct.ports[1]", ErrDuplicate, "port 9000 given twice"},
		{"direct ports not list", "direct:\n  ports: 9000\n", "2:10 direct.ports", ErrInvalid, "want a list, got 9000"},
		{"direct cidr", "direct:\n  cidrs: [10.0.0.0/33]\n", "2:11 direct.cidrs[0]", ErrInvalid, `"10.0.0.0/33" is not an IP address or a CIDR prefix`},
		{"direct default_ports", "direct:\n  default_ports: no\n", "2:18 direct.default_ports", ErrInvalid, "want true or false"},
		{"direct learn unknown", "direct:\n  learn: {enable: true}\n", "2:11 direct.learn.enable", ErrUnknownField, "want one of enabled, ttl"},
		{"direct learn ttl negative", "direct:\n  learn: {ttl: -1m}\n", "2:16 direct.learn.ttl", ErrInvalid, "-1m is negative"},
		{"direct learn ttl zero", "direct:\n  learn: {ttl: 0s}\n", "2:16 direct.learn.ttl", ErrInvalid, "more than 0"},
		{"direct learn ttl unit", "direct:\n  learn: {ttl: 600}\n", "2:16 direct.learn.ttl", ErrInvalid, "has no unit"},
		{"refresh command not list", "upstreams:\n  - host: a.test\n    credential:\n      bearer_token_file: " + token + "\n      refresh_command: renew --now\n", "5:24 upstreams[0].credential.refresh_command", ErrInvalid, "want a list"},

		// Contradictions, reported at the field set last.
		{"attempt > overall", "defaults:\n  timeout: 2s\n  attempt_timeout: 3s\n", "3:20 defaults.attempt_timeout", ErrConflict, "longer than the overall timeout 2s (timeout at bad.yaml:2)"},
		{"attempt > inherited overall", "defaults:\n  timeout: 2s\nupstreams:\n  - host: a.test\n    attempt_timeout: 3s\n", "5:22 upstreams[0].attempt_timeout", ErrConflict, "longer than the overall timeout 2s (timeout at bad.yaml:2)"},
		{"overall < inherited attempt", "defaults:\n  attempt_timeout: 5s\nupstreams:\n  - host: a.test\n    timeout: 4s\n", "5:14 upstreams[0].timeout", ErrConflict, "attempt_timeout 5s is longer than the overall timeout 4s"},
		{"attempt > default overall", "defaults:\n  attempt_timeout: 20s\n", "2:20 defaults.attempt_timeout", ErrConflict, "(timeout by default)"},
		{"min_attempt no room", "upstreams:\n  - host: a.test\n    timeout: 40ms\n", "3:14 upstreams[0].timeout", ErrConflict, "min_attempt 50ms leaves no room"},
		{"base > max", "defaults:\n  backoff:\n    base: 2s\n", "3:11 defaults.backoff.base", ErrConflict, "backoff.base 2s is more than backoff.max 1s"},
		{"no budget", "defaults:\n  budget: {ratio: 0, min_per_second: 0}\n", "2:19 defaults.budget.ratio", ErrConflict, "set max_attempts: 1"},
		{"inject without honours", "upstreams:\n  - host: a.test\n    inject_idempotency_key: true\n", "3:29 upstreams[0].inject_idempotency_key", ErrConflict, "needs honours_idempotency_key: true"},
		{"inject, honours off", "upstreams:\n  - host: a.test\n    inject_idempotency_key: true\n    honours_idempotency_key: false\n", "3:29 upstreams[0].inject_idempotency_key", ErrConflict, "needs honours_idempotency_key"},
		{"spool < memory", "defaults:\n  body: {memory_limit: 1MiB, spool_limit: 512KiB}\n", "2:43 defaults.body.spool_limit", ErrConflict, "less than body.memory_limit"},
		{"h2 without tls", "upstreams:\n  - host: a.test\n    protocol: h2\n", "3:15 upstreams[0].protocol", ErrConflict, "needs tls.enabled"},
		{"h2c with tls", "upstreams:\n  - host: a.test\n    protocol: h2c\n    tls: {enabled: true}\n", "3:15 upstreams[0].protocol", ErrConflict, "cleartext"},
		{"tls field without enabled", "upstreams:\n  - host: a.test\n    tls:\n      ca_file: " + keys.caFile + "\n", "4:16 upstreams[0].tls.ca_file", ErrConflict, "tls.enabled is not true"},
		{"cert without key", "upstreams:\n  - host: a.test\n    tls:\n      enabled: true\n      cert_file: " + keys.clientCert + "\n", "5:18 upstreams[0].tls.cert_file", ErrConflict, "go together"},
		{"insecure with ca", "upstreams:\n  - host: a.test\n    tls:\n      enabled: true\n      ca_file: " + keys.caFile + "\n      insecure_skip_verify: true\n", "6:29 upstreams[0].tls.insecure_skip_verify", ErrConflict, "turns off the check"},
		{"refresher without token file", "upstreams:\n  - host: a.test\n    credential:\n      refresh_command: [/bin/true]\n", "4:24 upstreams[0].credential.refresh_command", ErrConflict, "needs credential.bearer_token_file"},
		{"shared name, other budget", "upstreams:\n  - {host: a.test, name: s}\n  - {host: b.test, name: s, budget: {ratio: 0.5}}\n", "3:26 upstreams[1].name", ErrConflict, "not its budget settings"},

		// Files.
		{"ca missing", "upstreams:\n  - host: a.test\n    tls:\n      enabled: true\n      ca_file: " + missing + "\n", "5:16 upstreams[0].tls.ca_file", ErrFile, "no such file"},
		{"ca not pem", "upstreams:\n  - host: a.test\n    tls:\n      enabled: true\n      ca_file: " + notPEM + "\n", "5:16 upstreams[0].tls.ca_file", ErrFile, "no PEM certificate"},
		{"key does not match", "upstreams:\n  - host: a.test\n    tls:\n      enabled: true\n      cert_file: " + keys.clientCert + "\n      key_file: " + keys.serverKey + "\n", "5:18 upstreams[0].tls.cert_file", ErrFile, "client certificate"},
		{"token missing", "upstreams:\n  - host: a.test\n    credential:\n      cleartext_addresses: [10.0.0.1]\n      bearer_token_file: " + missing + "\n", "5:26 upstreams[0].credential.bearer_token_file", ErrFile, "no such file"},
		{"token empty", "upstreams:\n  - host: a.test\n    credential:\n      cleartext_addresses: [10.0.0.1]\n      bearer_token_file: " + emptyToken + "\n", "5:26 upstreams[0].credential.bearer_token_file", ErrFile, "empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(c.yaml))
			if err == nil {
				t.Fatalf("accepted:\n%s", c.yaml)
			}
			if !errors.Is(err, c.err) {
				t.Errorf("error %q is not %v", err, c.err)
			}
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error %T %q is not a list of *Error", err, err)
			}
			e := es[0]
			if len(es) != 1 {
				t.Errorf("%d problems reported for one:\n%v", len(es), err)
			}
			if got := fmt.Sprintf("%d:%d %s", e.Line, e.Column, e.Path); got != c.at {
				t.Errorf("at %q, want %q (%v)", got, c.at, err)
			}
			if !strings.Contains(e.Msg, c.msg) {
				t.Errorf("message %q does not say %q", e.Msg, c.msg)
			}
			if !strings.HasPrefix(err.Error(), "bad.yaml:") {
				t.Errorf("%q does not start with the file name", err)
			}
		})
	}
}

// The message format is file:line:column: path: reason.
func TestErrorFormat(t *testing.T) {
	src := "upstreams:\n  - host: a.test\n  - host: b.test\n    backoff:\n      kind: jitter\n"
	_, err := Parse("policy.yaml", []byte(src))
	want := `policy.yaml:5:13: upstreams[1].backoff.kind: "jitter" is not full or decorrelated`
	if err == nil || err.Error() != want {
		t.Errorf("got %q\nwant %q", err, want)
	}
}

// Every problem of a file is reported, in file order, not only the first.
func TestAllProblemsReported(t *testing.T) {
	src := "defaults:\n  max_attempts: 0\n  timeout: x\nupstreams:\n  - host: a.test\n    bulkhead: -3\n    colour: red\n"
	_, err := Parse("p.yaml", []byte(src))
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("%v", err)
	}
	var lines []int
	for _, e := range es {
		lines = append(lines, e.Line)
	}
	if fmt.Sprint(lines) != "[2 3 6 7]" {
		t.Errorf("problems on lines %v, want [2 3 6 7]:\n%v", lines, err)
	}
	if !errors.Is(err, ErrUnknownField) || !errors.Is(err, ErrInvalid) {
		t.Errorf("%v does not wrap both sentinels", err)
	}
}

// Relative paths are taken from the policy file's folder.
func TestRelativePaths(t *testing.T) {
	dir := t.TempDir()
	keys := newPKI(t, dir)
	writeFile(t, dir, "tok", "abc")
	path := writeFile(t, dir, "p.yaml", "upstreams:\n  - host: a.test\n    tls: {enabled: true, ca_file: ca.pem, cert_file: client.pem, key_file: client-key.pem}\n    credential: {bearer_token_file: tok}\n")
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	u := p.Match("a.test", 443)
	if u.TLS.CAFile != keys.caFile || u.Credential.BearerTokenFile != filepath.Join(dir, "tok") || u.Refresher().Token() != "abc" {
		t.Errorf("paths %+v %+v", u.TLS, u.Credential)
	}
	// From another working folder the same file still loads.
	wd, _ := os.Getwd()
	t.Cleanup(func() { _ = os.Chdir(wd) })
	if err := os.Chdir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Errorf("from another folder: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "nope.yaml")); !errors.Is(err, ErrFile) {
		t.Errorf("missing file: %v", err)
	}
}
