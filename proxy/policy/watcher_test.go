package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/prometheus/client_golang/prometheus"
)

// syncBuffer is a log sink safe for the watcher's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// reloads reads egret_policy_reloads_total{result} from reg.
func reloads(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "egret_policy_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no egret_policy_reloads_total{result=%q}", result)
	return 0
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// eventually waits up to 5 s for cond: a reload shows only in the
// watcher's metrics, logs and Current, none of which signals.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, what, cond)
}

func policyFile(attempts int) string {
	return fmt.Sprintf("upstreams:\n  - host: api.test\n    max_attempts: %d\n", attempts)
}

type watchRig struct {
	w    *Watcher
	path string
	reg  *prometheus.Registry
	logs *syncBuffer
	// reads counts Current calls made by a reader running all along, which
	// checks every policy it sees is whole.
	reads atomic.Int64
}

func startWatcher(t *testing.T, content string) *watchRig {
	t.Helper()
	dir := t.TempDir()
	r := &watchRig{path: filepath.Join(dir, "policy.yaml"), reg: prometheus.NewRegistry(), logs: &syncBuffer{}}
	writeFile(t, dir, "policy.yaml", content)
	logger := slog.New(slog.NewTextHandler(r.logs, nil))
	w, err := NewWatcher(r.path, logger, r.reg)
	if err != nil {
		t.Fatal(err)
	}
	w.Interval = 10 * time.Millisecond
	r.w = w
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := w.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	go func() { // a reader, as the proxy is, during every reload
		defer wg.Done()
		for ctx.Err() == nil {
			p := w.Current()
			if p == nil || p.Match("api.test", 80).MaxAttempts < 1 {
				t.Errorf("reader saw %+v", p)
				return
			}
			r.reads.Add(1)
			time.Sleep(100 * time.Microsecond) // not synchronisation: the reader's pace
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return r
}

func (r *watchRig) attempts() int { return r.w.Current().Match("api.test", 80).MaxAttempts }

func (r *watchRig) write(t *testing.T, content string) {
	t.Helper()
	if err := os.WriteFile(r.path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestWatcherPicksUpChange(t *testing.T) {
	r := startWatcher(t, policyFile(2))
	if r.attempts() != 2 || reloads(t, r.reg, "success") != 1 || gauge(t, r.reg, "egret_policy_last_reload_successful") != 1 {
		t.Fatalf("initial: attempts %d", r.attempts())
	}
	r.write(t, policyFile(4))
	eventually(t, "max_attempts 4", func() bool { return r.attempts() == 4 })
	if got := reloads(t, r.reg, "success"); got != 2 {
		t.Errorf("success count %v, want 2", got)
	}
	if !strings.Contains(r.logs.String(), "policy loaded") {
		t.Errorf("logs: %s", r.logs)
	}
	if gauge(t, r.reg, "egret_policy_last_reload_success_timestamp_seconds") < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Error("last success timestamp not set")
	}
	// An unchanged file is not reloaded again. Not synchronisation: 15
	// polls' time in which nothing may happen (an absence, which no event
	// shows).
	time.Sleep(15 * r.w.Interval)
	if got := reloads(t, r.reg, "success"); got != 2 {
		t.Errorf("success count %v after no change, want 2", got)
	}
	if r.reads.Load() == 0 {
		t.Error("the reader never ran")
	}
}

func TestWatcherRefusesBadFile(t *testing.T) {
	r := startWatcher(t, policyFile(2))
	old := r.w.Current()
	r.write(t, "upstreams:\n  - host: api.test\n    max_attempts: 3\n    backoff:\n      kind: jitter\n")
	eventually(t, "a failure counted", func() bool { return reloads(t, r.reg, "failure") == 1 })
	if r.w.Current() != old || r.attempts() != 2 {
		t.Errorf("a bad file replaced the policy: attempts %d", r.attempts())
	}
	logs := r.logs.String()
	if !strings.Contains(logs, "policy refused; keeping the running policy") ||
		!strings.Contains(logs, `policy.yaml:5:13: upstreams[0].backoff.kind: \"jitter\" is not full or decorrelated`) ||
		!strings.Contains(logs, "line=5") {
		t.Errorf("logs do not give the line and reason:\n%s", logs)
	}
	if gauge(t, r.reg, "egret_policy_last_reload_successful") != 0 {
		t.Error("last_reload_successful still 1")
	}
	// The same bad file is refused once, not on every poll (not
	// synchronisation: 25 polls' time in which no refusal may be added).
	time.Sleep(25 * r.w.Interval)
	if got := reloads(t, r.reg, "failure"); got != 1 {
		t.Errorf("failures %v, want 1", got)
	}
	// Reload says why too.
	err := r.w.Reload()
	var e *Error
	if !errors.As(err, &e) || e.Line != 5 || !errors.Is(err, ErrInvalid) {
		t.Errorf("Reload: %v", err)
	}
	// Fixing the file puts it in force.
	r.write(t, policyFile(5))
	eventually(t, "max_attempts 5", func() bool { return r.attempts() == 5 })
	if gauge(t, r.reg, "egret_policy_last_reload_successful") != 1 {
		t.Error("last_reload_successful not back to 1")
	}
}

// Replacing the file by renaming a new one over it (what editors and
// ConfigMap updates do) is seen.
func TestWatcherAtomicReplace(t *testing.T) {
	r := startWatcher(t, policyFile(2))
	for i, n := range []int{3, 4, 5} {
		tmp := filepath.Join(filepath.Dir(r.path), fmt.Sprintf(".policy.yaml.%d", i))
		if err := os.WriteFile(tmp, []byte(policyFile(n)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, r.path); err != nil {
			t.Fatal(err)
		}
		eventually(t, fmt.Sprintf("max_attempts %d", n), func() bool { return r.attempts() == n })
	}
}

func TestWatcherSurvivesMissingFile(t *testing.T) {
	r := startWatcher(t, policyFile(2))
	if err := os.Remove(r.path); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the missing file noticed", func() bool { return strings.Contains(r.logs.String(), "policy file unreadable") })
	time.Sleep(10 * r.w.Interval) // not synchronisation: 10 polls without the file, in which nothing may change
	if r.attempts() != 2 {
		t.Fatalf("policy changed while the file was missing: %d", r.attempts())
	}
	if got := reloads(t, r.reg, "failure"); got != 1 {
		t.Errorf("a missing file counted %v times, want once", got)
	}
	if err := r.w.Reload(); !errors.Is(err, ErrFile) {
		t.Errorf("Reload of a missing file: %v", err)
	}
	r.write(t, policyFile(6))
	eventually(t, "max_attempts 6", func() bool { return r.attempts() == 6 })
	if !strings.Contains(r.logs.String(), "policy file is back") {
		t.Errorf("logs: %s", r.logs)
	}
}

// An edit that keeps the size and the modification time is still found,
// by hashing the content every few polls.
func TestWatcherSameSizeSameMtime(t *testing.T) {
	r := startWatcher(t, policyFile(2))
	fi, err := os.Stat(r.path)
	if err != nil {
		t.Fatal(err)
	}
	r.write(t, policyFile(7))
	if err := os.Chtimes(r.path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "max_attempts 7", func() bool { return r.attempts() == 7 })
}

func TestWatcherReload(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "p.yaml", policyFile(2))
	w, err := NewWatcher(path, slog.New(slog.NewTextHandler(&syncBuffer{}, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "p.yaml", policyFile(3))
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := w.Current().Match("api.test", 1).MaxAttempts; got != 3 {
		t.Errorf("after Reload: %d", got)
	}
	// A watcher does not start on a bad or missing file.
	writeFile(t, dir, "bad.yaml", "defaults: {max_attempts: -1}\n")
	quiet := slog.New(slog.NewTextHandler(&syncBuffer{}, nil))
	if _, err := NewWatcher(filepath.Join(dir, "bad.yaml"), quiet, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad file: %v", err)
	}
	if _, err := NewWatcher(filepath.Join(dir, "none.yaml"), quiet, nil); !errors.Is(err, ErrFile) || strings.Count(err.Error(), "none.yaml") != 1 {
		t.Errorf("missing file: %v", err)
	}
	// Two watchers cannot register the same metrics in one registry.
	reg := prometheus.NewRegistry()
	if _, err := NewWatcher(path, quiet, reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewWatcher(path, quiet, reg); err == nil {
		t.Error("second registration accepted")
	}
}

// Rotating a TLS file the policy names reloads the policy, so new
// connections use the new material.
func TestWatcherReloadsOnTLSRotation(t *testing.T) {
	dir := t.TempDir()
	newPKI(t, dir)
	path := writeFile(t, dir, "policy.yaml", "upstreams:\n  - host: api.test\n    max_attempts: 2\n    tls: {enabled: true, ca_file: ca.pem}\n")
	reg := prometheus.NewRegistry()
	w, err := NewWatcher(path, slog.New(slog.NewTextHandler(&syncBuffer{}, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	w.Interval = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	old := w.Current()
	oldPool := old.Match("api.test", 1).TLSConfig().RootCAs
	newPKI(t, dir) // a fresh CA written over ca.pem in place
	eventually(t, "a reload after the CA file changed", func() bool { return w.Current() != old })
	if w.Current().Match("api.test", 1).TLSConfig().RootCAs.Equal(oldPool) {
		t.Error("the reloaded policy trusts the old CA")
	}
	if reloads(t, reg, "success") != 2 {
		t.Errorf("successes %v", reloads(t, reg, "success"))
	}
}

// A policy refused for a file it names is tried again, unchanged, once the
// file is there; while it is missing, the refusal is logged once.
func TestWatcherRetriesWhenNamedFileAppears(t *testing.T) {
	r := startWatcher(t, policyFile(2))
	dir := filepath.Dir(r.path)
	r.write(t, "upstreams:\n  - host: api.test\n    max_attempts: 3\n    tls: {enabled: true, ca_file: later/ca.pem}\n")
	eventually(t, "the refusal", func() bool { return reloads(t, r.reg, "failure") == 1 })
	time.Sleep(3 * rehashEvery * r.w.Interval) // not synchronisation: several retries' time, in which no refusal may be added
	if got := reloads(t, r.reg, "failure"); got != 1 {
		t.Errorf("the same refusal counted %v times", got)
	}
	if n := strings.Count(r.logs.String(), "policy refused"); n != 1 {
		t.Errorf("the same refusal logged %d times", n)
	}
	if r.attempts() != 2 {
		t.Fatalf("attempts %d", r.attempts())
	}
	if err := os.Mkdir(filepath.Join(dir, "later"), 0o700); err != nil {
		t.Fatal(err)
	}
	newPKI(t, filepath.Join(dir, "later"))
	eventually(t, "the policy in force once its CA exists", func() bool { return r.attempts() == 3 })

	// The CA file goes away under a running policy: one refusal, the
	// policy stays; it comes back: loaded again.
	ca := filepath.Join(dir, "later", "ca.pem")
	data, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(ca); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a refusal for the missing CA", func() bool { return reloads(t, r.reg, "failure") == 2 })
	time.Sleep(3 * rehashEvery * r.w.Interval) // not synchronisation: as above, an absence
	if got := reloads(t, r.reg, "failure"); got != 2 || r.attempts() != 3 {
		t.Errorf("failures %v attempts %d", got, r.attempts())
	}
	successes := reloads(t, r.reg, "success")
	writeFile(t, filepath.Join(dir, "later"), "ca.pem", string(data))
	eventually(t, "a reload once the CA is back", func() bool { return reloads(t, r.reg, "success") > successes })
}

// A policy refused at start is the caller's error to report: NewWatcher
// returns it with its line and logs nothing, so egret prints it once.
func TestNewWatcherRefusalIsReturnedNotLogged(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "policy.yaml", "defaults:\n  max_attempts: 3\n  routes: [1\n  timeout: 2s\n")
	var logs syncBuffer
	_, err := NewWatcher(path, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry())
	if err == nil {
		t.Fatal("a policy that does not parse was accepted")
	}
	// The unclosed list starts on line 3 (yaml/v3 alone says line 2).
	if want := path + ":3: did not find expected ',' or ']'"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if logs.String() != "" {
		t.Errorf("the refusal was also logged: %s", logs.String())
	}
}

// An empty or comment-only file on reload (a file caught mid-write, a
// truncation) is not taken for "every upstream entry gone": it is refused,
// logged and counted, and the running policy stays. A file that says it
// wants the defaults only is applied.
func TestWatcherRefusesEmptyFileUnlessExplicit(t *testing.T) {
	r := startWatcher(t, policyFile(2))
	failures := 0.0
	for _, content := range []string{"", "\n\n", "# being rewritten\n# upstreams:\n", "---\n"} {
		r.write(t, content)
		failures++
		eventually(t, fmt.Sprintf("%q refused", content), func() bool { return reloads(t, r.reg, "failure") == failures })
		if r.attempts() != 2 {
			t.Fatalf("%q replaced the policy: attempts %d", content, r.attempts())
		}
		if gauge(t, r.reg, "egret_policy_last_reload_successful") != 0 {
			t.Errorf("%q: last_reload_successful not 0", content)
		}
		if err := r.w.Reload(); !errors.Is(err, ErrEmpty) {
			t.Errorf("Reload of %q: %v, want ErrEmpty", content, err)
		}
		// Between two empty contents, a good one (else the same refusal
		// is not logged and counted again).
		r.write(t, policyFile(2)+"# ok\n")
		eventually(t, "back to a good file", func() bool {
			return gauge(t, r.reg, "egret_policy_last_reload_successful") == 1
		})
	}
	if !strings.Contains(r.logs.String(), "no policy in the file") {
		t.Errorf("logs do not say why:\n%s", r.logs)
	}
	r.write(t, "defaults: {}\n")
	eventually(t, "the explicit defaults applied", func() bool {
		return r.attempts() == Default().Match("api.test", 80).MaxAttempts && len(r.w.Current().Upstreams) == 0
	})
}

// A policy path that became a directory is an error, logged and counted
// (it used to change nothing and say nothing); the file back is loaded.
func TestWatcherDirectoryIsAnError(t *testing.T) {
	r := startWatcher(t, policyFile(2))
	if err := os.Remove(r.path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(r.path, 0o755); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the directory refused", func() bool { return strings.Contains(r.logs.String(), "is a directory") })
	if got := reloads(t, r.reg, "failure"); got < 1 {
		t.Errorf("failures %v, want at least 1", got)
	}
	if gauge(t, r.reg, "egret_policy_last_reload_successful") != 0 {
		t.Error("last_reload_successful not 0")
	}
	if r.attempts() != 2 {
		t.Fatalf("policy changed: %d", r.attempts())
	}
	if err := r.w.Reload(); !errors.Is(err, ErrFile) {
		t.Errorf("Reload of a directory: %v", err)
	}
	os.Remove(r.path)
	r.write(t, policyFile(3))
	eventually(t, "max_attempts 3", func() bool { return r.attempts() == 3 })
}

// At start an empty file is refused too: egret does not start on a policy
// other than the one it was given.
func TestNewWatcherRefusesEmptyFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "policy.yaml", "# nothing yet\n")
	if _, err := NewWatcher(filepath.Join(dir, "policy.yaml"), slog.New(slog.DiscardHandler), nil); !errors.Is(err, ErrEmpty) {
		t.Fatalf("NewWatcher on a comment-only file: %v", err)
	}
}

// Changed is closed by a reload that puts a new policy in force, not by a
// refused one.
func TestWatcherChanged(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "policy.yaml", policyFile(2))
	w, err := NewWatcher(path, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ch := w.Changed()
	writeFile(t, dir, "policy.yaml", "defaults: {max_attempts: 0}\n")
	if err := w.Reload(); err == nil {
		t.Fatal("a bad file was taken")
	}
	select {
	case <-ch:
		t.Fatal("a refused reload closed Changed")
	default:
	}
	writeFile(t, dir, "policy.yaml", policyFile(4))
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Fatal("a reload did not close Changed")
	}
	if next := w.Changed(); next == ch {
		t.Fatal("Changed not renewed after a reload")
	}
}
