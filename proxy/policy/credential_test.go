package policy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func credentialPolicy(t *testing.T, dir, credential string) *Upstream {
	t.Helper()
	path := writeFile(t, dir, "policy.yaml", "upstreams:\n  - host: api.test\n    port: 443\n    tls: {enabled: true}\n    credential:\n"+credential)
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	u := p.Match("api.test", 443)
	if u.Refresher() == nil {
		t.Fatal("no refresher")
	}
	return u
}

func TestRefresherRereadsTokenFile(t *testing.T) {
	dir := t.TempDir()
	tok := writeFile(t, dir, "token", "  tok1\n")
	u := credentialPolicy(t, dir, "      bearer_token_file: token\n")
	r := u.Refresher()
	if r.Token() != "tok1" {
		t.Fatalf("token %q", r.Token())
	}
	writeFile(t, dir, "token", "tok2")
	if r.Token() != "tok1" {
		t.Fatalf("token changed before a refresh: %q", r.Token())
	}
	if err := r.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r.Token() != "tok2" {
		t.Fatalf("after refresh %q", r.Token())
	}
	// A refresh that finds no usable token keeps the old one.
	if err := os.WriteFile(tok, []byte("bad token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Refresh(context.Background()); !errors.Is(err, ErrRefresh) || !strings.Contains(err.Error(), "not allowed in a header") {
		t.Errorf("refresh with a bad token: %v", err)
	}
	if err := os.Remove(tok); err != nil {
		t.Fatal(err)
	}
	if err := r.Refresh(context.Background()); !errors.Is(err, ErrRefresh) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refresh with no file: %v", err)
	}
	if r.Token() != "tok2" {
		t.Errorf("a failed refresh lost the token: %q", r.Token())
	}
}

// The refresh command renews the file; RetryPolicy.Refresh runs it and
// rewrites the request's Authorization header.
func TestRefreshCommandThroughRetryPolicy(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "token", "tok1\n")
	u := credentialPolicy(t, dir, `      bearer_token_file: token
      refresh_command: ["sh", "-c", "echo tok2 > \"$0\"", "`+filepath.Join(dir, "token")+`"]
`)
	rp := u.RetryPolicy("GET", "/")
	if rp.Refresh == nil {
		t.Fatal("RetryPolicy has no Refresh")
	}
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	u.Refresher().Apply(req)
	if got := req.Header.Get("Authorization"); got != "Bearer tok1" {
		t.Errorf("first attempt: Authorization %q", got)
	}
	if err := rp.Refresh(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if got := req.Header.Get("Authorization"); got != "Bearer tok2" {
		t.Errorf("after refresh: Authorization %q", got)
	}
	if u.Refresher().Token() != "tok2" {
		t.Errorf("token %q", u.Refresher().Token())
	}
}

// With a refresh command, the token file may not exist yet: the first
// refresh creates it.
func TestRefreshCommandCreatesToken(t *testing.T) {
	dir := t.TempDir()
	u := credentialPolicy(t, dir, `      bearer_token_file: later
      refresh_command: ["sh", "-c", "printf fresh > later"]
`)
	if u.Refresher().Token() != "" {
		t.Fatalf("token %q before any file", u.Refresher().Token())
	}
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	u.Refresher().Apply(req)
	if req.Header.Get("Authorization") != "" {
		t.Error("Authorization set without a token")
	}
	// The command runs in the policy file's folder, wherever egret runs.
	if err := u.RetryPolicy("GET", "/").Refresh(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if got := req.Header.Get("Authorization"); got != "Bearer fresh" {
		t.Errorf("Authorization %q", got)
	}
}

func TestRefreshCommandFails(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "token", "tok1\n")
	u := credentialPolicy(t, dir, `      bearer_token_file: token
      refresh_command: ["sh", "-c", "echo 'vault: permission denied' >&2; exit 3"]
`)
	err := u.Refresher().Refresh(context.Background())
	if !errors.Is(err, ErrRefresh) || !strings.Contains(err.Error(), "exit status 3") ||
		!strings.Contains(err.Error(), "vault: permission denied") {
		t.Errorf("error %v", err)
	}
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	if err := u.RetryPolicy("GET", "/").Refresh(context.Background(), req); err == nil || req.Header.Get("Authorization") != "" {
		t.Errorf("a failed refresh set Authorization %q (err %v)", req.Header.Get("Authorization"), err)
	}
	if u.Refresher().Token() != "tok1" {
		t.Errorf("token %q", u.Refresher().Token())
	}
}

// A command that hangs is stopped at refresh_timeout, children included.
func TestRefreshCommandTimeout(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "token", "tok1\n")
	u := credentialPolicy(t, dir, `      bearer_token_file: token
      refresh_command: ["sh", "-c", "sleep 30 & sleep 30; echo late > token"]
      refresh_timeout: 200ms
`)
	start := time.Now()
	err := u.Refresher().Refresh(context.Background())
	took := time.Since(start)
	if !errors.Is(err, ErrRefresh) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v", err)
	}
	if took > 3*time.Second {
		t.Errorf("refresh took %v with a 200ms timeout", took)
	}
	// The caller's context bounds it too.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := u.Refresher().Refresh(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("with a short context: %v", err)
	}
}

// Refreshes that overlap (a burst of 401s) run the command once.
func TestConcurrentRefreshesCoalesce(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "token", "tok0\n")
	runs := filepath.Join(dir, "runs")
	u := credentialPolicy(t, dir, fmt.Sprintf(`      bearer_token_file: token
      refresh_command: ["sh", "-c", "echo run >> %s; sleep 0.3; echo tok1 > %s"]
`, runs, filepath.Join(dir, "token")))
	r := u.Refresher()
	const n = 16
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs <- r.Refresh(context.Background())
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	data, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	if c := strings.Count(string(data), "run"); c < 1 || c > 2 {
		t.Errorf("%d concurrent refreshes ran the command %d times", n, c)
	}
	if r.Token() != "tok1" {
		t.Errorf("token %q", r.Token())
	}
	// A later refresh runs it again.
	if err := r.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, _ = os.ReadFile(runs)
	if c := strings.Count(string(data), "run"); c < 2 {
		t.Errorf("a later refresh did not run the command (%d runs)", c)
	}
}
