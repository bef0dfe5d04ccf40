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

// FileError is a problem at one line of a pods file. It matches ErrFile.
type FileError struct {
	File string
	Line int // 0 when the problem is the whole file
	Msg  string
}

func (e *FileError) Error() string {
	if e.Line > 0 {
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
	var raw rawFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlErrors(name, err)
	}
	var doc yaml.Node
	_ = yaml.Unmarshal(data, &doc)
	lines := podLines(&doc)

	var errs []error
	fail := func(i int, field, format string, args ...any) {
		errs = append(errs, &FileError{File: name, Line: lines.of(i, field), Msg: fmt.Sprintf(format, args...)})
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
				fail(i, "name", "%s: name already used at line %d", what, lines.of(j, "name"))
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
					what, p.Cgroup, raw.Pods[j].Name, lines.of(j, "cgroup"))
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
		for _, port := range rp.Exclude.Ports {
			if port < 1 || port > 65535 {
				fail(i, "exclude", "%s: excluded port %d out of range 1..65535", what, port)
				continue
			}
			p.Exclude.Ports = append(p.Exclude.Ports, uint16(port))
		}
		for _, c := range rp.Exclude.CIDRs {
			pfx, err := netip.ParsePrefix(c)
			if err != nil {
				if a, aerr := netip.ParseAddr(c); aerr == nil {
					pfx, err = netip.PrefixFrom(a, a.BitLen()), nil
				}
			}
			if err != nil {
				fail(i, "exclude", "%s: excluded CIDR %q: %v", what, c, err)
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
				fail(i, "learn", "%s: learn ttl %q: a positive duration (e.g. 10m)", what, rp.Learn.TTL)
			} else {
				p.Learn.TTL = d
			}
		}
		if rp.Limits.Connections < 0 {
			fail(i, "limits", "%s: limits.connections %d is negative", what, rp.Limits.Connections)
		}
		if rp.Limits.InFlight < 0 {
			fail(i, "limits", "%s: limits.in_flight %d is negative", what, rp.Limits.InFlight)
		}
		p.Limits.Conns, p.Limits.InFlight = rp.Limits.Connections, rp.Limits.InFlight
		if rp.Limits.SpoolBytes != "" {
			n, err := policy.ParseSize(rp.Limits.SpoolBytes)
			if err != nil {
				fail(i, "limits", "%s: limits.spool_bytes: %v", what, err)
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

func yamlErrors(name string, err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		var errs []error
		for _, e := range te.Errors {
			errs = append(errs, lineError(name, e))
		}
		return errors.Join(errs...)
	}
	return lineError(name, err.Error())
}

func lineError(name, msg string) error {
	n, msg := yamlerr.Line(msg)
	// yaml/v3 names the Go type of an unknown key's mapping: say what the
	// file may hold there instead.
	if m := unknownField.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("unknown field %q (want one of %s)", m[1], fieldsOf[m[2]])
	}
	return &FileError{File: name, Line: n, Msg: msg}
}

var unknownField = regexp.MustCompile(`^field (\S+) not found in type pods\.(\w+)$`)

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

// lineIndex finds the line of each pod and of its top-level fields.
type lineIndex []map[string]int

func (l lineIndex) of(i int, field string) int {
	if i < 0 || i >= len(l) {
		return 0
	}
	if n, ok := l[i][field]; ok {
		return n
	}
	return l[i][""]
}

func podLines(doc *yaml.Node) lineIndex {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil
	}
	for k := 0; k+1 < len(top.Content); k += 2 {
		if top.Content[k].Value != "pods" || top.Content[k+1].Kind != yaml.SequenceNode {
			continue
		}
		var idx lineIndex
		for _, pn := range top.Content[k+1].Content {
			m := map[string]int{"": pn.Line}
			if pn.Kind == yaml.MappingNode {
				for f := 0; f+1 < len(pn.Content); f += 2 {
					m[pn.Content[f].Value] = pn.Content[f].Line
				}
			}
			idx = append(idx, m)
		}
		return idx
	}
	return nil
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
