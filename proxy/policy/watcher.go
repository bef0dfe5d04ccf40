package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"
)

// DefaultPollInterval is how often a Watcher looks at its file.
const DefaultPollInterval = time.Second

// rehashEvery: a Watcher hashes the file this many polls apart even when
// its size and modification time look unchanged (an edit within the
// file system's time granularity).
const rehashEvery = 10

// Watcher keeps the policy loaded from a file current. Readers call Current
// on every request: it is one atomic load, and a reload swaps the whole
// Policy at once, so no request ever sees half of one. A file that does not
// parse is refused (logged with its lines and counted) and the running
// policy stays in force; so do a file with no document in it (ErrEmpty:
// empty, blanks or comments only, as a file caught mid-write is; a policy
// of defaults only says so, e.g. `defaults: {}`), a file that is missing or
// cannot be read, and a path that became a directory.
type Watcher struct {
	// Interval between polls; set before Run. Default DefaultPollInterval.
	Interval time.Duration

	path    string
	logger  *slog.Logger
	metrics *metrics
	cur     atomic.Pointer[Policy]
	// changed is closed (and replaced) when a reload puts a new policy in
	// force; see Changed.
	changed atomic.Pointer[chan struct{}]

	mu      sync.Mutex // serialises loads; guards the fields below
	stat    os.FileInfo
	hash    [sha256.Size]byte
	refs    map[string]os.FileInfo // files the current policy names
	missing bool
	polls   int
	// lastRefusal is the error of the last refused load ("" after a
	// success): the same problems are logged and counted once.
	lastRefusal string
}

// NewWatcher loads the policy file at path and returns a Watcher serving it.
// A missing or bad file is an error here, returned and not logged (the
// caller reports it, once): egret does not start on a policy other than
// the one it was given. logger nil means slog.Default(); reg nil
// means no metrics.
func NewWatcher(path string, logger *slog.Logger, reg prometheus.Registerer) (*Watcher, error) {
	if logger == nil {
		logger = slog.Default()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	w := &Watcher{Interval: DefaultPollInterval, path: path, logger: logger, metrics: m}
	ch := make(chan struct{})
	w.changed.Store(&ch)
	if err := w.Reload(); err != nil {
		return nil, err
	}
	return w, nil
}

// Current is the policy in force.
func (w *Watcher) Current() *Policy { return w.cur.Load() }

// Changed returns a channel that is closed when a reload next puts a new
// policy in force (a refused file does not). Take it before reading
// Current: a reload in between closes it.
func (w *Watcher) Changed() <-chan struct{} { return *w.changed.Load() }

// Path is the file watched.
func (w *Watcher) Path() string { return w.path }

// Reload reads and parses the file now. On success the new policy is in
// force; on failure the error says why (lines included) and the running
// policy stays.
func (w *Watcher) Reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	fi, err := os.Stat(w.path)
	if err != nil {
		e := fileError(w.path, err)
		w.refused(e)
		return e
	}
	w.missing = false
	data, err := readPolicyFile(w.path)
	if err != nil {
		w.refused(err)
		return err
	}
	w.stat = fi
	w.hash = sha256.Sum256(data)
	return w.load(data)
}

// Run polls the file every Interval until ctx ends, reloading when its
// content or a file it names (TLS material) changes. It returns nil when
// ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	every := w.Interval
	if every <= 0 {
		every = DefaultPollInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.poll()
		}
	}
}

// poll reloads if the file changed since the last load or refusal.
func (w *Watcher) poll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.polls++
	fi, err := os.Stat(w.path)
	if err != nil {
		if !w.missing {
			w.missing = true
			w.logger.Warn("policy file unreadable; keeping the running policy",
				"path", w.path, "error", err.Error())
			w.metrics.failure()
		}
		return
	}
	if w.missing {
		w.missing = false
		w.logger.Info("policy file is back", "path", w.path)
	}
	refsChanged := w.refsChanged()
	if !refsChanged && w.stat != nil && sameStat(fi, w.stat) && w.polls%rehashEvery != 0 {
		return
	}
	data, err := readPolicyFile(w.path)
	if err != nil {
		// Unreadable, or a directory: said and counted once.
		w.stat = fi
		w.hash = [sha256.Size]byte{}
		w.refused(err)
		return
	}
	w.stat = fi
	h := sha256.Sum256(data)
	// A refused file is tried again now and then, unchanged: what it
	// lacked (a certificate, a token) may have appeared since.
	retry := w.lastRefusal != "" && w.polls%rehashEvery == 0
	if h == w.hash && !refsChanged && !retry {
		return
	}
	w.hash = h
	_ = w.load(data) // logged and counted by load
}

// load parses data and puts it in force, or refuses it. w.mu is held.
func (w *Watcher) load(data []byte) error {
	if noDocument(data) {
		err := &Error{File: w.path, Msg: "no policy in the file (empty, or comments only); " +
			"the running policy stays. A policy of defaults only must say so, e.g. `defaults: {}`", Err: ErrEmpty}
		w.refs = statFiles(w.cur.Load())
		w.refused(err)
		return err
	}
	p, err := Parse(w.path, data)
	if err != nil {
		// The running policy's files, seen as they are now: a refusal is
		// not taken for a change of them at the next poll.
		w.refs = statFiles(w.cur.Load())
		w.refused(err)
		return err
	}
	w.refs = statFiles(p)
	w.lastRefusal = ""
	w.cur.Store(p)
	next := make(chan struct{})
	close(*w.changed.Swap(&next))
	w.metrics.success(time.Now())
	w.logger.Info("policy loaded", "path", w.path, "upstreams", len(p.Upstreams),
		"sha256", hex.EncodeToString(w.hash[:6]))
	for _, warn := range p.Warnings {
		w.logger.Warn("policy: "+warn, "path", w.path)
	}
	return nil
}

// refused logs and counts a refusal, once for the same problems.
func (w *Watcher) refused(err error) {
	if err.Error() == w.lastRefusal {
		return
	}
	w.lastRefusal = err.Error()
	// Logged before it is counted: whoever sees the count sees the line.
	defer w.metrics.failure()
	attrs := []any{"path", w.path, "error", err.Error()}
	var es Errors
	var e *Error
	switch {
	case errors.As(err, &es) && len(es) > 0:
		attrs = append(attrs, "line", es[0].Line, "problems", len(es))
	case errors.As(err, &e):
		attrs = append(attrs, "line", e.Line)
	}
	// The first load's refusal is NewWatcher's error: its caller reports
	// it, once.
	if w.cur.Load() != nil {
		w.logger.Error("policy refused; keeping the running policy", attrs...)
	}
}

// noDocument reports whether data holds no YAML document: nothing, blank
// lines, comments, or a lone document marker. An explicit empty mapping
// ("{}") or "defaults: {}" is a document.
func noDocument(data []byte) bool {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return false // a syntax error: Parse says where
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return true
	}
	n := doc.Content[0]
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null" && n.Value == ""
}

// statFiles stats the files p names (none for nil).
func statFiles(p *Policy) map[string]os.FileInfo {
	if p == nil {
		return nil
	}
	refs := make(map[string]os.FileInfo, len(p.files))
	for _, f := range p.files {
		if fi, err := os.Stat(f); err == nil {
			refs[f] = fi
		}
	}
	return refs
}

// refsChanged reports whether a file the current policy names changed.
func (w *Watcher) refsChanged() bool {
	p := w.cur.Load()
	if p == nil {
		return false
	}
	for _, f := range p.files {
		fi, err := os.Stat(f)
		old, had := w.refs[f]
		if (err == nil) != had || (err == nil && !sameStat(fi, old)) {
			return true
		}
	}
	return false
}

func sameStat(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}
