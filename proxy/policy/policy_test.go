package policy

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry"
)

// loadExample copies testdata/example.yaml into a folder beside the files
// it names (a generated CA, client certificate and token) and loads it.
func loadExample(t *testing.T) (*Policy, *pki) {
	t.Helper()
	dir := t.TempDir()
	keys := newPKI(t, dir)
	writeFile(t, dir, "token", "example-token\n")
	data, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, dir, "policy.yaml", string(data))
	p, err := Load(path)
	if err != nil {
		t.Fatalf("example.yaml: %v", err)
	}
	return p, keys
}

func TestDefaultFollowsSpec(t *testing.T) {
	d := Default()
	if len(d.Upstreams) != 0 {
		t.Fatalf("embedded defaults have %d upstream entries", len(d.Upstreams))
	}
	u := d.Match("api.example.com", 443)
	want := retry.DefaultPolicy("api.example.com:443")
	got := u.RetryPolicy("GET", "/")
	if got.Upstream != want.Upstream || got.MaxAttempts != 3 || got.Timeout != 15*time.Second ||
		got.MinAttempt != 50*time.Millisecond || got.AttemptTimeout != 0 ||
		got.Backoff != (engine.Backoff{Kind: engine.FullJitter, Base: 25 * time.Millisecond, Max: time.Second}) ||
		got.Budget != (engine.BudgetConfig{Ratio: 0.2, MinPerSecond: 10, TTL: 10 * time.Second}) ||
		got.Refresh != nil || len(got.TransientStatuses) != 0 {
		t.Errorf("default RetryPolicy = %+v", got)
	}
	if u.Body != (BodyLimits{MemoryLimit: 64 << 10, SpoolLimit: 8 << 20}) || u.Protocol != ProtocolAuto ||
		!u.MethodDefault || u.Bulkhead != 0 || u.TLS.Enabled || u.TLSConfig() != nil || u.Refresher() != nil {
		t.Errorf("default upstream = %+v", u)
	}
	// An empty file is the embedded defaults too.
	for _, empty := range []string{"", "# nothing\n", "---\n"} {
		p, err := Parse("empty.yaml", []byte(empty))
		if err != nil {
			t.Fatalf("%q: %v", empty, err)
		}
		pd, dd := *p.Defaults, *d.Defaults
		pd.dests, dd.dests = nil, nil // caches of their own
		if !reflect.DeepEqual(pd, dd) {
			t.Errorf("%q: defaults %+v, want %+v", empty, p.Defaults, d.Defaults)
		}
	}
}

// The example's defaults block documents the embedded defaults: it must
// say exactly what they are.
func TestExampleDefaultsAreTheEmbeddedOnes(t *testing.T) {
	p, _ := loadExample(t)
	got, want := *p.Defaults, *Default().Defaults
	// The values, not where they were written (Fields).
	got.origins, want.origins = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("example defaults\n %+v\nembedded\n %+v", got, want)
	}
}

func TestExampleEveryField(t *testing.T) {
	p, keys := loadExample(t)
	if len(p.Upstreams) != 4 {
		t.Fatalf("%d upstreams, want 4", len(p.Upstreams))
	}
	u := p.Upstreams[0]
	want := Upstream{
		Name: "payments", Host: "payments.internal", Port: 8443,
		MaxAttempts: 4, Timeout: 10 * time.Second, AttemptTimeout: 2 * time.Second, MinAttempt: 100 * time.Millisecond,
		Backoff:               engine.Backoff{Kind: engine.DecorrelatedJitter, Base: 50 * time.Millisecond, Max: 2 * time.Second},
		Budget:                engine.BudgetConfig{Ratio: 0.1, MinPerSecond: 5, TTL: 30 * time.Second},
		TransientStatuses:     []int{500, 520},
		HonoursIdempotencyKey: true, InjectIdempotencyKey: true, MethodDefault: true,
		Routes: []Route{
			{Method: "POST", PathPrefix: "/v1/charges/search", Idempotent: true},
			{Method: "POST", PathPrefix: "/v1/charges", Idempotent: false},
			{Method: "*", PathPrefix: "/v1/admin/", Idempotent: false},
		},
		Bulkhead: 64,
		Body:     BodyLimits{MemoryLimit: 128 << 10, SpoolLimit: 16 << 20},
		Protocol: ProtocolH2,
		TLS: TLS{Enabled: true, ServerName: "payments.internal", CAFile: keys.caFile,
			CertFile: keys.clientCert, KeyFile: keys.clientKey},
		Credential: Credential{BearerTokenFile: filepath.Join(keys.dir, "token"),
			RefreshCommand: []string{"/usr/local/bin/renew-token", "--out", "token"}, RefreshTimeout: 5 * time.Second,
			Dir: keys.dir},
	}
	got := *u
	got.named, got.tlsConfig, got.tlsID, got.refresher, got.refresh, got.origins = false, nil, "", nil, nil, nil
	if got.dests != nil {
		t.Error("a named entry has a destination cache")
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("upstreams[0]\n got %+v\nwant %+v", got, want)
	}
	if u.Refresher() == nil || u.Refresher().Token() != "example-token" {
		t.Errorf("refresher token = %v", u.Refresher())
	}
	cfg := u.TLSConfig()
	if cfg == nil || cfg.ServerName != "payments.internal" || len(cfg.Certificates) != 1 ||
		cfg.RootCAs == nil || !reflect.DeepEqual(cfg.NextProtos, []string{"h2"}) {
		t.Errorf("TLS config = %+v", cfg)
	}

	side := p.Upstreams[1]
	if side.Host != "10.96.0.15" || !reflect.DeepEqual(side.Credential.CleartextAddresses, []netip.Prefix{netip.MustParsePrefix("10.96.0.15/32")}) ||
		!side.CredentialAllowed(netip.MustParseAddr("10.96.0.15")) || side.CredentialAllowed(netip.MustParseAddr("10.96.0.16")) ||
		!u.CredentialAllowed(netip.Addr{}) {
		t.Errorf("upstreams[1] (cleartext credential) = %+v", side.Credential)
	}
	if !reflect.DeepEqual(p.DenyDestinations, DefaultDenyDestinations()) || !p.Denied(netip.MustParseAddr("169.254.169.254")) ||
		!p.Denied(netip.MustParseAddr("::ffff:169.254.169.254")) || p.Denied(netip.MustParseAddr("10.0.0.1")) {
		t.Errorf("deny_destinations = %v", p.DenyDestinations)
	}

	w := p.Upstreams[2]
	if w.Host != "*.cache.internal" || w.Port != 0 || w.MaxAttempts != 2 || w.Protocol != ProtocolH2C ||
		w.Timeout != 15*time.Second || len(w.Routes) != 1 {
		t.Errorf("upstreams[1] = %+v", w)
	}
}

func TestMatchPrecedence(t *testing.T) {
	p, err := Parse("m.yaml", []byte(`
upstreams:
  - {host: api.example.com, port: 443, max_attempts: 1}
  - {host: api.example.com, max_attempts: 2}
  - {host: "*.example.com", port: 443, max_attempts: 3}
  - {host: "*.example.com", max_attempts: 4}
  - {host: "*.eu.example.com", max_attempts: 5}
  - {host: 10.0.0.7, max_attempts: 6}
  - {host: "2001:db8::1", port: 8080, max_attempts: 7}
  - {host: "*.example.com", port: 8443, name: shared, max_attempts: 8}
  - {host: other.test, port: 8443, name: shared, max_attempts: 9}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host     string
		port     int
		attempts int
		name     string
	}{
		{"api.example.com", 443, 1, "api.example.com:443"},   // exact host and port
		{"API.Example.com.", 443, 1, "api.example.com:443"},  // case and trailing dot
		{"api.example.com", 80, 2, "api.example.com:80"},     // exact host, any port
		{"www.example.com", 443, 3, "www.example.com:443"},   // wildcard with port
		{"www.example.com", 80, 4, "www.example.com:80"},     // wildcard, any port
		{"a.b.example.com", 80, 4, "a.b.example.com:80"},     // wildcard covers deeper names
		{"x.eu.example.com", 443, 5, "x.eu.example.com:443"}, // longer suffix beats a port
		{"example.com", 443, 3, ""},                          // *.example.com does not match example.com: defaults
		{"10.0.0.7", 9000, 6, "10.0.0.7:9000"},
		{"[2001:db8:0::1]", 8080, 7, "[2001:db8::1]:8080"}, // brackets and a longer spelling
		{"2001:db8::1", 8081, 3, ""},                       // defaults
		{"z.example.com", 8443, 8, "shared"},               // named entries share a budget
		{"other.test", 8443, 9, "shared"},
		{"notexample.com", 443, 3, ""}, // a suffix match must start at a dot
	} {
		u := p.Match(c.host, c.port)
		name := c.name
		if name == "" {
			if u != p.Match("unmatched.invalid", 1) && u.Host != "" {
				t.Errorf("%s:%d matched %q, want the defaults", c.host, c.port, u.Host)
				continue
			}
			name = u.Name // the defaults name the destination
			if !strings.Contains(name, strings.Trim(c.host, "[]")) {
				t.Errorf("%s:%d: defaults named %q", c.host, c.port, name)
			}
		}
		if u.MaxAttempts != c.attempts || u.Name != name {
			t.Errorf("%s:%d: max_attempts %d name %q, want %d %q", c.host, c.port, u.MaxAttempts, u.Name, c.attempts, name)
		}
		if rp := u.RetryPolicy("GET", "/"); rp.Upstream != u.Name {
			t.Errorf("%s:%d: RetryPolicy.Upstream %q, want %q", c.host, c.port, rp.Upstream, u.Name)
		}
	}
	// A fixed host and port keep one Upstream (no copy a request).
	if p.Match("api.example.com", 443) != p.Match("api.example.com", 443) {
		t.Error("an exact entry is copied on every Match")
	}
}

func TestRoutePrecedence(t *testing.T) {
	p, err := Parse("r.yaml", []byte(`
upstreams:
  - host: svc.test
    routes:
      - {method: "*", path_prefix: /, idempotent: false}
      - {method: POST, path_prefix: /api, idempotent: true}
      - {method: "*", path_prefix: /api/orders, idempotent: false}
      - {method: GET, path_prefix: /api/orders, idempotent: true}
      - {method: PUT, path_prefix: /api/orders/, idempotent: false}
      - {method: "*", path_prefix: /static/, idempotent: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	u := p.Match("svc.test", 80)
	for _, c := range []struct {
		method, path string
		prefix       string // "" for no route
		idem         bool
	}{
		{"GET", "/api/orders", "/api/orders", true},             // method-specific beats "*" at equal prefix
		{"POST", "/api/orders", "/api/orders", false},           // longest prefix, "*"
		{"POST", "/api/orders/7", "/api/orders", false},         // segment below
		{"PUT", "/api/orders/7", "/api/orders/", false},         // trailing-slash prefix, longer
		{"PUT", "/api/orders", "/api/orders", false},            // "/api/orders/" needs something under it
		{"POST", "/api/ordersx", "/api", true},                  // not a whole segment: falls to /api
		{"POST", "/api", "/api", true},                          // exact
		{"POST", "/apix", "/", false},                           // not a segment of /api
		{"DELETE", "/static/a.css", "/static/", true},           // "*" route
		{"GET", "/static", "/", false},                          // "/static/" needs a slash
		{"POST", "//api//orders/./7?x=1", "/api/orders", false}, // cleaned path, query ignored
		{"POST", "/api/../api/orders", "/api/orders", false},    // no escape by dot-dot
		{"get", "/api/orders", "/api/orders", false},            // methods are case-sensitive: "*" applies
	} {
		r, ok := u.Route(c.method, c.path)
		if !ok || r.PathPrefix != c.prefix || r.Idempotent != c.idem {
			t.Errorf("%s %s: route %+v %v, want prefix %q idempotent %v", c.method, c.path, r, ok, c.prefix, c.idem)
		}
		id := u.RetryPolicy(c.method, c.path).Idempotency
		if !id.RouteSet || id.Route != c.idem {
			t.Errorf("%s %s: RetryPolicy idempotency %+v", c.method, c.path, id)
		}
	}
	// Without a catch-all there may be no route.
	p2, err := Parse("r2.yaml", []byte("upstreams:\n  - host: a.test\n    routes: [{method: GET, path_prefix: /x, idempotent: false}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := p2.Match("a.test", 1).Route("GET", "/y"); ok {
		t.Errorf("GET /y matched %+v", r)
	}
}

// Idempotency is resolved route, then key, then method default; the result
// is what the attempt runner computes from RetryPolicy.
func TestIdempotencyResolution(t *testing.T) {
	p, err := Parse("i.yaml", []byte(`
upstreams:
  - host: keys.test
    honours_idempotency_key: true
    routes:
      - {method: POST, path_prefix: /never, idempotent: false}
      - {method: PATCH, path_prefix: /safe, idempotent: true}
  - host: nokeys.test
  - host: off.test
    method_default: off
    honours_idempotency_key: true
    inject_idempotency_key: true
    routes:
      - {method: GET, path_prefix: /read, idempotent: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host, method, path string
		key, want          bool
		inject             bool
	}{
		{"keys.test", "POST", "/never", true, false, false},   // route beats key
		{"keys.test", "DELETE", "/never", false, true, false}, // route is POST only: method default
		{"keys.test", "PATCH", "/safe", false, true, false},   // route beats method
		{"keys.test", "POST", "/other", true, true, false},    // key honoured
		{"keys.test", "POST", "/other", false, false, false},  // no key, POST
		{"keys.test", "PUT", "/other", false, true, false},    // method default
		{"nokeys.test", "POST", "/", true, false, false},      // key not honoured
		{"nokeys.test", "GET", "/", false, true, false},
		{"off.test", "GET", "/other", false, false, true},  // method default off; a key would be injected
		{"off.test", "PUT", "/other", true, true, false},   // key still honoured
		{"off.test", "GET", "/read/x", false, true, false}, // route
		{"off.test", "POST", "/x", false, false, true},
	} {
		u := p.Match(c.host, 80)
		rp := u.RetryPolicy(c.method, c.path)
		if got := rp.Idempotency.Resolve(c.method, c.key); got != c.want {
			t.Errorf("%s %s %s key=%v: idempotent %v, want %v (%+v)", c.host, c.method, c.path, c.key, got, c.want, rp.Idempotency)
		}
		if got := u.Idempotent(c.method, c.path, c.key); got != c.want {
			t.Errorf("%s %s %s key=%v: Idempotent %v, want %v", c.host, c.method, c.path, c.key, got, c.want)
		}
		if got := u.ShouldInjectKey(c.method, c.path, c.key); got != c.inject {
			t.Errorf("%s %s %s key=%v: ShouldInjectKey %v, want %v", c.host, c.method, c.path, c.key, got, c.inject)
		}
		if got := u.InjectsKey(rp.Idempotency, c.method, c.key); got != c.inject {
			t.Errorf("%s %s %s key=%v: InjectsKey %v, want %v", c.host, c.method, c.path, c.key, got, c.inject)
		}
		// Injecting makes it idempotent, as promised.
		if c.inject && !rp.Idempotency.Resolve(c.method, true) {
			t.Errorf("%s %s %s: an injected key does not make it idempotent", c.host, c.method, c.path)
		}
	}
}

func TestNewIdempotencyKey(t *testing.T) {
	uuid4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		k := NewIdempotencyKey()
		if !uuid4.MatchString(k) {
			t.Fatalf("%q is not a UUIDv4", k)
		}
		if seen[k] {
			t.Fatalf("%q twice", k)
		}
		seen[k] = true
	}
}

func TestInheritance(t *testing.T) {
	p, err := Parse("h.yaml", []byte(`
defaults:
  max_attempts: 5
  backoff: {base: 10ms}
  routes: [{method: POST, path_prefix: /rpc, idempotent: true}]
  transient_statuses: [500]
upstreams:
  - host: a.test
    backoff: {max: 300ms}
    routes: []
  - host: b.test
    max_attempts: 1
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b, d := p.Match("a.test", 1), p.Match("b.test", 1), p.Match("c.test", 1)
	if a.MaxAttempts != 5 || a.Backoff.Base != 10*time.Millisecond || a.Backoff.Max != 300*time.Millisecond ||
		a.Backoff.Kind != engine.FullJitter || len(a.Routes) != 0 || !reflect.DeepEqual(a.TransientStatuses, []int{500}) {
		t.Errorf("a = %+v", a)
	}
	if b.MaxAttempts != 1 || len(b.Routes) != 1 || b.Backoff.Max != time.Second {
		t.Errorf("b = %+v", b)
	}
	if d.MaxAttempts != 5 || !d.Idempotent("POST", "/rpc/x", false) {
		t.Errorf("defaults = %+v", d)
	}
}

// TestMatchKeepsOneCopyPerDestination: an entry without a fixed name is
// named after each destination; the copy is made once per destination
// (not per request), and stays right under concurrent use.
func TestMatchKeepsOneCopyPerDestination(t *testing.T) {
	p := Default()
	a1, a2 := p.Match("a.example", 80), p.Match("A.example.", 80)
	b := p.Match("b.example", 80)
	if a1 != a2 || a1.Name != "a.example:80" || b.Name != "b.example:80" || a1 == b {
		t.Fatalf("a %p %q / %p %q, b %p %q", a1, a1.Name, a2, a2.Name, b, b.Name)
	}
	if p.Defaults.Name != "" {
		t.Fatalf("the defaults were renamed: %q", p.Defaults.Name)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range maxDests/4 + 100 {
				host := fmt.Sprintf("h%d.example", (g*977+i)%(maxDests+500))
				if u := p.Match(host, 8080); u.Name != host+":8080" {
					t.Errorf("%s: named %q", host, u.Name)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := p.Defaults.dests.n.Load(); n > maxDests {
		t.Fatalf("%d destinations cached, bound %d", n, maxDests)
	}
	if allocs := testing.AllocsPerRun(100, func() { p.Match("a.example", 80) }); allocs != 0 {
		t.Fatalf("%.1f allocations per Match of a known destination", allocs)
	}
}
