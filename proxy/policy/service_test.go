package policy

import (
	"errors"
	"testing"
)

func TestServiceEntries(t *testing.T) {
	p, err := Parse("p.yaml", []byte(`
upstreams:
  - service: shop/backend
    max_attempts: 5
  - service: shop/pay
    port: 8080
    name: payments
`))
	if err != nil {
		t.Fatal(err)
	}
	if u := p.MatchService("shop", "backend", 80); u.MaxAttempts != 5 || u.Name != "shop/backend:80" || !u.Service() {
		t.Errorf("shop/backend:80: %d attempts, name %q", u.MaxAttempts, u.Name)
	}
	if u := p.MatchService("shop", "pay", 8080); u.Name != "payments" {
		t.Errorf("shop/pay:8080 named %q", u.Name)
	}
	if u := p.MatchService("shop", "pay", 9090); u.Service() || u.Name != "shop/pay:9090" {
		t.Errorf("shop/pay:9090 (no entry) got %q, service %v", u.Name, u.Service())
	}
	// No Host header reaches a service: entry.
	if u := p.Match("shop/backend", 80); u.Service() {
		t.Error("Match reached a service: entry by host")
	}
	for _, doc := range []string{
		"upstreams:\n  - service: shop/backend\n    host: a.example\n",
		"upstreams:\n  - service: Shop/backend\n",
		"upstreams:\n  - service: backend\n",
	} {
		if _, err := Parse("p.yaml", []byte(doc)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", doc, err)
		}
	}
}
