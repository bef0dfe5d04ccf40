package pods

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/yamlerr"
	"github.com/egret-proxy/egret/proxy/policy"
)

// NetnsDir is where a bare network namespace name in a pods file is taken
// from (the directory `ip netns` uses).
const NetnsDir = "/run/netns"

// DefaultReloadInterval is how often File checks its file for changes.
const DefaultReloadInterval = time.Second

const maxFileSize = 4 << 20

// The file's schema. Decoding is strict: unknown keys are errors.
type rawFile struct {
	Pods []rawPod `yaml:"pods"`
}

type rawPod struct {
	Name             string     `yaml:"name"`
	Workload         string     `yaml:"workload"`
	Cgroup           string     `yaml:"cgroup"`
	Netns            string     `yaml:"netns"`
	ListenPort       int        `yaml:"listen_port"`
	RedirectLoopback bool       `yaml:"redirect_loopback"`
	Exclude          rawExclude `yaml:"exclude"`
	Learn            rawLearn   `yaml:"learn"`
	Policy           yaml.Node  `yaml:"policy"`
	Limits           rawLimits  `yaml:"limits"`
}

type rawLimits struct {
	Connections int    `yaml:"connections"`
	InFlight    int    `yaml:"in_flight"`
	SpoolBytes  string `yaml:"spool_bytes"`
}

type rawLearn struct {
	Enabled *bool  `yaml:"enabled"`
	TTL     string `yaml:"ttl"`
}

type rawExclude struct {
	Ports        []int    `yaml:"ports"`
	CIDRs        []string `yaml:"cidrs"`
	DefaultPorts *bool    `yaml:"default_ports"`
}

// FileError is a problem at one place of a pods file. It matches ErrFile.
type FileError struct {
	File   string
	Line   int // 1-based; 0 when the problem is the whole file
	Column int // 1-based; 0 when unknown (yaml/v3 gives no column for a syntax error)
	Msg    string
}

// Error formats as "file:line:column: message", as a policy file's errors.
func (e *FileError) Error() string {
	switch {
	case e.Line > 0 && e.Column > 0:
		return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
	case e.Line > 0:
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// Is makes errors.Is(err, ErrFile) true.
func (e *FileError) Is(target error) bool { return target == ErrFile }

// Parse decodes a pods file (name is used in errors). See README.md for the
// format. Every error is a *FileError with the line it concerns; several
// are joined.
func Parse(name string, data []byte) ([]Pod, error) {
	if len(data) > maxFileSize {
		return nil, &FileError{File: name, Msg: fmt.Sprintf("larger than %d bytes", maxFileSize)}
	}
	var doc yaml.Node
	_ = yaml.Unmarshal(data, &doc)
	var raw rawFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlErrors(name, err, &doc)
	}
	lines := podNodes(&doc)

	var errs []error
	// fail reports a problem of pod i at the value of its field (a path
	// such as "exclude", "cidrs", 0), or at the pod when it has none.
	fail := func(i int, field, format string, args ...any) {
		n := lines.at(i, field)
		errs = append(errs, &FileError{File: name, Line: n.Line, Column: n.Column, Msg: fmt.Sprintf(format, args...)})
	}
	out := make([]Pod, 0, len(raw.Pods))
	seen := map[string]int{}
	seenCg := map[string]int{}
	for i, rp := range raw.Pods {
		p := Pod{Name: rp.Name, Workload: rp.Workload, RedirectLoopback: rp.RedirectLoopback}
		what := fmt.Sprintf("pods[%d]", i)
		if rp.Name == "" {
			fail(i, "", "%s: name is required", what)
		} else {
			what = "pod " + rp.Name
			if j, dup := seen[rp.Name]; dup {
				fail(i, "name", "%s: name already used at line %d", what, lines.at(j, "name").Line)
			}
			seen[rp.Name] = i
		}
		switch {
		case rp.Cgroup == "":
			fail(i, "", "%s: cgroup is required", what)
		case filepath.IsAbs(rp.Cgroup):
			p.Cgroup = filepath.Clean(rp.Cgroup)
		default:
			p.Cgroup = filepath.Join(cgroup2.Root(), rp.Cgroup)
		}
		if p.Cgroup != "" {
			if err := CheckCgroup(p.Cgroup); err != nil {
				fail(i, "cgroup", "%s: %v", what, err)
			} else if j, dup := seenCg[p.Cgroup]; dup {
				fail(i, "cgroup", "%s: cgroup %s is already pod %s's (line %d): one cgroup per pod",
					what, p.Cgroup, raw.Pods[j].Name, lines.at(j, "cgroup").Line)
			} else {
				seenCg[p.Cgroup] = i
			}
		}
		switch {
		case rp.Netns == "" || rp.Netns == "host":
		case filepath.IsAbs(rp.Netns):
			p.Netns = filepath.Clean(rp.Netns)
		case strings.ContainsRune(rp.Netns, '/'):
			fail(i, "netns", "%s: netns %q: an absolute path or a name in %s", what, rp.Netns, NetnsDir)
		default:
			p.Netns = filepath.Join(NetnsDir, rp.Netns)
		}
		if rp.ListenPort < 0 || rp.ListenPort > 65535 {
			fail(i, "listen_port", "%s: listen_port %d out of range 1..65535", what, rp.ListenPort)
		}
		p.ListenPort = uint16(rp.ListenPort)
		for k, port := range rp.Exclude.Ports {
			if port < 1 || port > 65535 {
				fail(i, fmt.Sprintf("exclude.ports.%d", k), "%s: excluded port %d out of range 1..65535", what, port)
				continue
			}
			p.Exclude.Ports = append(p.Exclude.Ports, uint16(port))
		}
		for k, c := range rp.Exclude.CIDRs {
			pfx, err := netip.ParsePrefix(c)
			if err != nil {
				if a, aerr := netip.ParseAddr(c); aerr == nil {
					pfx, err = netip.PrefixFrom(a, a.BitLen()), nil
				}
			}
			if err != nil {
				fail(i, fmt.Sprintf("exclude.cidrs.%d", k), "%s: excluded CIDR %q: %v", what, c, err)
				continue
			}
			p.Exclude.CIDRs = append(p.Exclude.CIDRs, pfx.Masked())
		}
		if rp.Exclude.DefaultPorts != nil {
			p.Exclude.NoDefaultPorts, p.Exclude.DefaultPorts = !*rp.Exclude.DefaultPorts, *rp.Exclude.DefaultPorts
		}
		if rp.Learn.Enabled != nil {
			p.Learn.Off, p.Learn.On = !*rp.Learn.Enabled, *rp.Learn.Enabled
		}
		if rp.Learn.TTL != "" {
			d, err := time.ParseDuration(rp.Learn.TTL)
			if err != nil || d <= 0 {
				fail(i, "learn.ttl", "%s: learn ttl %q: a positive duration (e.g. 10m)", what, rp.Learn.TTL)
			} else {
				p.Learn.TTL = d
			}
		}
		if rp.Limits.Connections < 0 {
			fail(i, "limits.connections", "%s: limits.connections %d is negative", what, rp.Limits.Connections)
		}
		if rp.Limits.InFlight < 0 {
			fail(i, "limits.in_flight", "%s: limits.in_flight %d is negative", what, rp.Limits.InFlight)
		}
		p.Limits.Conns, p.Limits.InFlight = rp.Limits.Connections, rp.Limits.InFlight
		if rp.Limits.SpoolBytes != "" {
			n, err := policy.ParseSize(rp.Limits.SpoolBytes)
			if err != nil {
				fail(i, "limits.spool_bytes", "%s: limits.spool_bytes: %v", what, err)
			}
			p.Limits.SpoolBytes = n
		}
		if rp.Policy.Kind != 0 {
			b, err := yaml.Marshal(&rp.Policy)
			if err == nil {
				_, err = policy.Overlay(policy.Default(), what+" policy", b)
			}
			if err != nil {
				fail(i, "policy", "%s: policy (lines counted from the policy key): %v", what, err)
			} else {
				p.Policy = b
			}
		}
		out = append(out, p)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// CheckCgroup refuses a pod cgroup (a clean absolute path) that is not
// strictly below cgroup2.Root(): the root itself, or anything at or above it,
// would put every process of the node (egret's own included) behind
// egret.
func CheckCgroup(cg string) error {
	rel, err := filepath.Rel(cgroup2.Root(), cg)
	switch {
	case err != nil || rel == ".." || strings.HasPrefix(rel, "../"):
		return fmt.Errorf("cgroup %s is not below the cgroup v2 root %s", cg, cgroup2.Root())
	case rel == ".":
		return fmt.Errorf("cgroup %s is the cgroup v2 root: every process of the node would be redirected", cg)
	}
	return nil
}

func yamlErrors(name string, err error, doc *yaml.Node) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		var errs []error
		for _, e := range te.Errors {
			errs = append(errs, lineError(name, e, doc))
		}
		return errors.Join(errs...)
	}
	return lineError(name, err.Error(), doc)
}

// lineError makes a FileError of one yaml/v3 message. yaml/v3 names only
// the line of a decoding error: the column is the key it names (an
// unknown field) or the value it quotes (a wrong type), found in doc.
func lineError(name, msg string, doc *yaml.Node) error {
	n, msg := yamlerr.Line(msg)
	col := 0
	// yaml/v3 names the Go type of an unknown key's mapping: say what the
	// file may hold there instead.
	if m := unknownField.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("unknown field %q (want one of %s)", m[1], fieldsOf[m[2]])
		col = columnOf(doc, n, m[1])
	} else if m := typeValue.FindStringSubmatch(msg); m != nil {
		col = columnOf(doc, n, m[1])
	}
	return &FileError{File: name, Line: n, Column: col, Msg: msg}
}

var (
	unknownField = regexp.MustCompile(`^field (\S+) not found in type pods\.(\w+)$`)
	// typeValue is the value a type error quotes (yaml/v3 shortens a long
	// one with "...").
	typeValue = regexp.MustCompile("^cannot unmarshal !!\\w+ `([^`]*)` into ")
)

// columnOf is the column of the first scalar on line whose value is v
// (v may end in "...", a prefix), or 0.
func columnOf(doc *yaml.Node, line int, v string) int {
	prefix, short := strings.CutSuffix(v, "...")
	var walk func(n *yaml.Node) int
	walk = func(n *yaml.Node) int {
		if n.Kind == yaml.ScalarNode && n.Line == line &&
			(n.Value == v || short && strings.HasPrefix(n.Value, prefix)) {
			return n.Column
		}
		for _, c := range n.Content {
			if col := walk(c); col > 0 {
				return col
			}
		}
		return 0
	}
	return walk(doc)
}

// fieldsOf lists the keys of each mapping of the file, for errors.
var fieldsOf = map[string]string{
	"rawFile":    fieldNames(rawFile{}),
	"rawPod":     fieldNames(rawPod{}),
	"rawExclude": fieldNames(rawExclude{}),
}

func fieldNames(v any) string {
	t := reflect.TypeOf(v)
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		names = append(names, strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0])
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// podIndex holds each pod's node, to place an error at a field's value.
type podIndex []*yaml.Node

// at is the node of pod i's field path (keys and list indexes joined by
// dots, such as "exclude.cidrs.1"): the deepest part of it the file has,
// else the pod itself. A zero node when there is no pod i.
func (l podIndex) at(i int, path string) *yaml.Node {
	if i < 0 || i >= len(l) {
		return &yaml.Node{}
	}
	n := l[i]
	if path == "" {
		return n
	}
	for _, part := range strings.Split(path, ".") {
		next := child(n, part)
		if next == nil {
			break
		}
		n = next
	}
	return n
}

// child is the value of key k of a mapping, or item k of a sequence.
func child(n *yaml.Node, k string) *yaml.Node {
	switch n.Kind {
	case yaml.MappingNode:
		for f := 0; f+1 < len(n.Content); f += 2 {
			if n.Content[f].Value == k {
				return n.Content[f+1]
			}
		}
	case yaml.SequenceNode:
		if idx, err := strconv.Atoi(k); err == nil && idx >= 0 && idx < len(n.Content) {
			return n.Content[idx]
		}
	}
	return nil
}

func podNodes(doc *yaml.Node) podIndex {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	pods := child(doc.Content[0], "pods")
	if pods == nil || pods.Kind != yaml.SequenceNode {
		return nil
	}
	return pods.Content
}

// File is a Source reading a pods file. It checks the file every Interval
// and, when it changed, parses it again and sends the differences. A file
// that no longer parses is refused (OnError is told, with the line) and
// the pods last read stay in force.
type File struct {
	path string
	h    *hub

	// Interval between checks (DefaultReloadInterval if 0).
	Interval time.Duration
	// OnError, if set, is told about every refused reload.
	OnError func(error)
	// OnReload, if set, is told about every accepted reload.
	OnReload func(pods int)

	mu   sync.Mutex
	last fileStamp
	err  error
}

var _ Source = (*File)(nil)

type fileStamp struct {
	mod  time.Time
	size int64
	ino  uint64
	data string
}

// NewFile reads and parses path now, so a bad file is refused at start.
func NewFile(path string) (*File, error) {
	f := &File{path: path, h: newHub()}
	if err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Err returns the error of the last refused reload, nil after a good one.
func (f *File) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Pods returns the pods in force.
func (f *File) Pods() map[string]Pod {
	p, _ := f.h.snapshot()
	return p
}

// Reload reads the file now. On error the pods in force stay.
func (f *File) Reload() error {
	data, st, err := f.read()
	if err == nil {
		var ps []Pod
		ps, err = Parse(f.path, data)
		if err == nil {
			m := make(map[string]Pod, len(ps))
			for _, p := range ps {
				m[p.Name] = p
			}
			f.h.replace(m)
		}
	}
	f.mu.Lock()
	f.err = err
	if err == nil {
		f.last = st
	} else {
		// Do not re-parse the same bad bytes every interval.
		f.last = st
	}
	f.mu.Unlock()
	return err
}

func (f *File) read() ([]byte, fileStamp, error) {
	fh, err := os.Open(f.path)
	if err != nil {
		return nil, fileStamp{}, &FileError{File: f.path, Msg: err.Error()}
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return nil, fileStamp{}, &FileError{File: f.path, Msg: err.Error()}
	}
	data, err := io.ReadAll(io.LimitReader(fh, maxFileSize+1))
	if err != nil {
		return nil, fileStamp{}, &FileError{File: f.path, Msg: err.Error()}
	}
	return data, fileStamp{mod: fi.ModTime(), size: fi.Size(), ino: inode(fi), data: string(data)}, nil
}

func (f *File) changed() bool {
	fi, err := os.Stat(f.path)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		return f.err == nil // newly missing: report it once
	}
	return !fi.ModTime().Equal(f.last.mod) || fi.Size() != f.last.size || inode(fi) != f.last.ino
}

// Run implements Source: it watches the file while sending events.
func (f *File) Run(ctx context.Context, events chan<- Event) error {
	every := f.Interval
	if every <= 0 {
		every = DefaultReloadInterval
	}
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if !f.changed() {
				continue
			}
			if err := f.Reload(); err != nil {
				if f.OnError != nil {
					f.OnError(err)
				}
			} else if f.OnReload != nil {
				f.OnReload(len(f.Pods()))
			}
		}
	}()
	return f.h.run(ctx, events)
}
