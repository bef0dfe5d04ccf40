package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/internal/yamlerr"
)

// The file is decoded from a yaml.Node tree rather than into structs: each
// value keeps its line and column, unknown and repeated keys are caught with
// their own positions, and validation errors name the field's path.

// pos is where a value was written.
type pos struct {
	file      string
	line, col int
	path      string
}

// val is one optional field of a layer.
type val[T any] struct {
	v   T
	set bool
	at  pos
}

func (v *val[T]) put(x T, at pos) { v.v, v.set, v.at = x, true, at }

// rawUpstream is one layer: the defaults block or one upstream entry, as
// written. Single values are checked when decoded; combinations are checked
// when the layers are resolved.
type rawUpstream struct {
	at pos // the entry itself

	Name val[string]
	Host val[string]
	Port val[int]

	MaxAttempts    val[int]
	Timeout        val[time.Duration]
	AttemptTimeout val[time.Duration]
	MinAttempt     val[time.Duration]
	BackoffKind    val[engine.BackoffKind]
	BackoffBase    val[time.Duration]
	BackoffMax     val[time.Duration]
	BudgetRatio    val[float64]
	BudgetMin      val[float64]
	BudgetTTL      val[time.Duration]
	Transient      val[[]int]
	HonoursKey     val[bool]
	InjectKey      val[bool]
	MethodDefault  val[bool]
	Routes         val[[]Route]
	Bulkhead       val[int]
	MemoryLimit    val[int64]
	SpoolLimit     val[int64]
	Protocol       val[Protocol]
	TLSEnabled     val[bool]
	ServerName     val[string]
	CAFile         val[string]
	CertFile       val[string]
	KeyFile        val[string]
	Insecure       val[bool]
	TokenFile      val[string]
	RefreshCommand val[[]string]
	RefreshTimeout val[time.Duration]
	CommandDir     val[string]
	Cleartext      val[[]netip.Prefix]
}

// rawDoc is one decoded file.
type rawDoc struct {
	file      string
	defaults  *rawUpstream
	upstreams []*rawUpstream
	deny      val[[]netip.Prefix] // deny_destinations
	direct    rawDirect
}

// rawDirect is the direct: section as written.
type rawDirect struct {
	Ports        val[[]uint16]
	CIDRs        val[[]netip.Prefix]
	DefaultPorts val[bool]
	Learn        val[bool]
	LearnTTL     val[time.Duration]
}

type decoder struct {
	file     string
	dir      string // relative file paths are taken from here
	override bool   // a per-pod override: node-only fields refused
	errs     Errors
	visits   int // nodes walked, aliases expanded; bounded by maxVisits
}

// maxVisits bounds the nodes one decode walks: aliases are expanded, and
// a small file of nested aliases must not keep the agent busy.
const maxVisits = 100_000

func (d *decoder) fail(at pos, sentinel error, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Line: at.line, Column: at.col,
		Path: at.path, Msg: fmt.Sprintf(format, args...), Err: sentinel})
}

func (d *decoder) posOf(n *yaml.Node, path string) pos {
	return pos{file: d.file, line: n.Line, col: n.Column, path: path}
}

// decodeDoc parses data into a rawDoc, collecting every problem it finds.
func (d *decoder) decodeDoc(data []byte) *rawDoc {
	doc := &rawDoc{file: d.file}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return doc // an empty file: the embedded defaults
		}
		d.syntax(err)
		return doc
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		d.fail(d.posOf(&extra, ""), ErrSyntax, "more than one YAML document")
		return doc
	} else if !errors.Is(err, io.EOF) {
		d.syntax(err)
		return doc
	}
	n := &root
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return doc
		}
		n = n.Content[0]
	}
	if n = d.deref(n, ""); n == nil {
		return doc
	}
	if isNull(n) {
		return doc
	}
	d.mapping(n, "", map[string]func(*yaml.Node, string){
		"defaults": func(v *yaml.Node, p string) {
			doc.defaults = d.upstream(v, p, -1)
		},
		"deny_destinations": func(v *yaml.Node, p string) {
			if d.override {
				d.fail(d.posOf(v, p), ErrNotOverridable, "only the node's policy may set this")
				return
			}
			d.prefixes(v, p, &doc.deny)
		},
		"direct": func(v *yaml.Node, p string) {
			if d.override {
				d.fail(d.posOf(v, p), ErrNotOverridable, "only the node's policy may set this (a pod's own are the pods file's exclude: and learn:, or its annotations)")
				return
			}
			d.direct(v, p, &doc.direct)
		},
		"upstreams": func(v *yaml.Node, p string) {
			if isNull(v) {
				return // every entry commented out
			}
			d.sequence(v, p, func(i int, e *yaml.Node, ep string) {
				if u := d.upstream(e, ep, i); u != nil {
					doc.upstreams = append(doc.upstreams, u)
				}
			})
		},
	})
	return doc
}

func (d *decoder) syntax(err error) {
	line, msg := yamlerr.Line(err.Error())
	d.errs = append(d.errs, &Error{File: d.file, Line: line, Msg: msg, Err: ErrSyntax})
}

// deref follows aliases (bounded) and returns nil for a bad one, or once
// the decode has walked too many nodes.
func (d *decoder) deref(n *yaml.Node, path string) *yaml.Node {
	if d.visits++; d.visits > maxVisits {
		if d.visits == maxVisits+1 {
			d.fail(d.posOf(n, path), ErrSyntax, "more than %d values (aliases expanded)", maxVisits)
		}
		return nil
	}
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i == 16 {
			d.fail(d.posOf(n, path), ErrSyntax, "aliases nested too deep")
			return nil
		}
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing"
		case "!!str":
			return fmt.Sprintf("%q", n.Value)
		}
		return n.Value
	}
	return "an unexpected node"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// mapping decodes a mapping whose keys must all be in fields, each at most
// once.
func (d *decoder) mapping(n *yaml.Node, path string, fields map[string]func(*yaml.Node, string)) bool {
	if n = d.deref(n, path); n == nil {
		return false
	}
	if isNull(n) {
		return true // a block whose lines are all commented out
	}
	if n.Kind != yaml.MappingNode {
		d.fail(d.posOf(n, path), ErrInvalid, "want a mapping, got %s", kindName(n))
		return false
	}
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.fail(d.posOf(k, path), ErrInvalid, "a key must be a plain word")
			continue
		}
		kp := join(path, k.Value)
		if line, dup := seen[k.Value]; dup {
			d.fail(d.posOf(k, kp), ErrDuplicate, "given twice (first at line %d)", line)
			continue
		}
		seen[k.Value] = k.Line
		fn, ok := fields[k.Value]
		if !ok {
			d.fail(d.posOf(k, kp), ErrUnknownField, "unknown field (want one of %s)", keyList(fields))
			continue
		}
		fn(v, kp)
	}
	return true
}

func keyList(fields map[string]func(*yaml.Node, string)) string {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ", ")
}

// sequence calls each for the elements of a list; false if n is no list.
func (d *decoder) sequence(n *yaml.Node, path string, each func(i int, e *yaml.Node, ep string)) bool {
	if n = d.deref(n, path); n == nil {
		return false
	}
	if n.Kind != yaml.SequenceNode {
		d.fail(d.posOf(n, path), ErrInvalid, "want a list, got %s", kindName(n))
		return false
	}
	for i, e := range n.Content {
		each(i, e, fmt.Sprintf("%s[%d]", path, i))
	}
	return true
}

// scalar returns the scalar node with one of the tags, or nil after
// reporting what was there instead.
func (d *decoder) scalar(n *yaml.Node, path, want string, tags ...string) *yaml.Node {
	if n = d.deref(n, path); n == nil {
		return nil
	}
	if n.Kind == yaml.ScalarNode && slices.Contains(tags, n.ShortTag()) {
		return n
	}
	d.fail(d.posOf(n, path), ErrInvalid, "want %s, got %s", want, kindName(n))
	return nil
}

func (d *decoder) str(n *yaml.Node, path string, dst *val[string]) (string, bool) {
	s := d.scalar(n, path, "a string", "!!str")
	if s == nil {
		return "", false
	}
	dst.put(s.Value, d.posOf(s, path))
	return s.Value, true
}

func (d *decoder) boolean(n *yaml.Node, path string, dst *val[bool]) {
	if s := d.scalar(n, path, "true or false", "!!bool"); s != nil {
		dst.put(s.Value == "true" || s.Value == "True" || s.Value == "TRUE", d.posOf(s, path))
	}
}

// integer decodes an integer in [lo, hi].
func (d *decoder) integer(n *yaml.Node, path string, lo, hi int64) (int64, pos, bool) {
	s := d.scalar(n, path, "an integer", "!!int")
	if s == nil {
		return 0, pos{}, false
	}
	at := d.posOf(s, path)
	var x int64
	if err := s.Decode(&x); err != nil {
		d.fail(at, ErrInvalid, "%s is not an integer", s.Value)
		return 0, at, false
	}
	if x < lo || x > hi {
		d.fail(at, ErrInvalid, "%d is out of range [%d, %d]", x, lo, hi)
		return 0, at, false
	}
	return x, at, true
}

func (d *decoder) intVal(n *yaml.Node, path string, lo, hi int64, dst *val[int]) {
	if x, at, ok := d.integer(n, path, lo, hi); ok {
		dst.put(int(x), at)
	}
}

// number decodes a finite number >= 0.
func (d *decoder) number(n *yaml.Node, path string, dst *val[float64]) {
	s := d.scalar(n, path, "a number", "!!int", "!!float")
	if s == nil {
		return
	}
	at := d.posOf(s, path)
	var x float64
	if err := s.Decode(&x); err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		d.fail(at, ErrInvalid, "%s is not a finite number", s.Value)
		return
	}
	if x < 0 {
		d.fail(at, ErrInvalid, "%s is negative", s.Value)
		return
	}
	dst.put(x, at)
}

// maxDuration bounds every duration in the file; longer is a typo.
const maxDuration = 24 * time.Hour

// duration decodes a Go duration string ("250ms", "15s") in [0, 24h];
// positive requires > 0. A bare 0 is accepted as zero.
func (d *decoder) duration(n *yaml.Node, path string, positive bool, dst *val[time.Duration]) {
	s := d.scalar(n, path, `a duration such as "250ms" or "15s"`, "!!str", "!!int")
	if s == nil {
		return
	}
	at := d.posOf(s, path)
	if s.ShortTag() == "!!int" && s.Value != "0" {
		d.fail(at, ErrInvalid, "%s has no unit (write e.g. \"%sms\" or \"%ss\")", s.Value, s.Value, s.Value)
		return
	}
	x, err := time.ParseDuration(s.Value)
	if err != nil {
		d.fail(at, ErrInvalid, "%q is not a duration such as \"250ms\" or \"15s\"", s.Value)
		return
	}
	switch {
	case x < 0:
		d.fail(at, ErrInvalid, "%s is negative", s.Value)
	case positive && x == 0:
		d.fail(at, ErrInvalid, "must be more than 0")
	case x > maxDuration:
		d.fail(at, ErrInvalid, "%s is longer than %s", s.Value, maxDuration)
	default:
		dst.put(x, at)
	}
}

// maxSize bounds body limits (1 GiB).
const maxSize int64 = 1 << 30

var sizeUnits = map[string]int64{
	"": 1, "B": 1,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
	"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30,
	"kB": 1000, "KB": 1000, "MB": 1000_000, "GB": 1000_000_000,
}

var sizePattern = regexp.MustCompile(`^([0-9]+)\s*([A-Za-z]*)$`)

// size decodes a byte size: 65536, "64KiB", "8MiB", "1MB".
func (d *decoder) size(n *yaml.Node, path string, dst *val[int64]) {
	s := d.scalar(n, path, `a size such as "64KiB" or "8MiB"`, "!!str", "!!int")
	if s == nil {
		return
	}
	at := d.posOf(s, path)
	x, err := ParseSize(s.Value)
	if err != nil {
		d.fail(at, ErrInvalid, "%s", err)
		return
	}
	dst.put(x, at)
}

// ParseSize parses a byte size as policy files write it: 65536, "64KiB",
// "8MiB", "1MB"; at most 1 GiB.
func ParseSize(s string) (int64, error) {
	m := sizePattern.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("%q is not a size such as \"64KiB\" or \"8MiB\"", s)
	}
	unit, ok := sizeUnits[m[2]]
	if !ok {
		return 0, fmt.Errorf("%q: unknown unit %q (want B, KiB, MiB, GiB, kB, MB or GB)", s, m[2])
	}
	x, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || x > maxSize/unit {
		return 0, fmt.Errorf("%q is more than 1GiB", s)
	}
	return x * unit, nil
}

// file decodes a path, absolute after joining with the file's directory.
func (d *decoder) filePath(n *yaml.Node, path string, dst *val[string]) {
	var v val[string]
	f, ok := d.str(n, path, &v)
	if !ok {
		return
	}
	if f == "" {
		d.fail(v.at, ErrInvalid, "empty path")
		return
	}
	if !filepath.IsAbs(f) {
		f = filepath.Join(d.dir, f)
	}
	dst.put(f, v.at)
}

// nodeOnly refuses a field in a per-pod override.
func (d *decoder) nodeOnly(fields map[string]func(*yaml.Node, string), names ...string) {
	if !d.override {
		return
	}
	for _, name := range names {
		fields[name] = func(v *yaml.Node, p string) {
			d.fail(d.posOf(v, p), ErrNotOverridable, "only the node's policy may set this")
		}
	}
}

// upstream decodes the defaults block (index < 0) or upstreams[index]:
// the same fields, except that host, port, name and credential belong to
// entries only. nil when the entry is unusable (its problems reported).
func (d *decoder) upstream(n *yaml.Node, path string, index int) *rawUpstream {
	n = d.deref(n, path)
	if n == nil {
		return nil
	}
	u := &rawUpstream{at: d.posOf(n, path)}
	hostGiven := false
	block := func(fields map[string]func(*yaml.Node, string)) func(*yaml.Node, string) {
		return func(v *yaml.Node, p string) { d.mapping(v, p, fields) }
	}
	fields := map[string]func(*yaml.Node, string){
		"max_attempts": func(v *yaml.Node, p string) { d.intVal(v, p, 1, 100, &u.MaxAttempts) },
		"timeout":      func(v *yaml.Node, p string) { d.duration(v, p, false, &u.Timeout) },
		"attempt_timeout": func(v *yaml.Node, p string) {
			d.duration(v, p, false, &u.AttemptTimeout)
		},
		"min_attempt": func(v *yaml.Node, p string) { d.duration(v, p, false, &u.MinAttempt) },
		"backoff": block(map[string]func(*yaml.Node, string){
			"kind": func(v *yaml.Node, p string) {
				var s val[string]
				if k, ok := d.str(v, p, &s); ok {
					kind, err := engine.ParseBackoffKind(k)
					if err != nil {
						d.fail(s.at, ErrInvalid, "%q is not full or decorrelated", k)
						return
					}
					u.BackoffKind.put(kind, s.at)
				}
			},
			"base": func(v *yaml.Node, p string) { d.duration(v, p, true, &u.BackoffBase) },
			"max":  func(v *yaml.Node, p string) { d.duration(v, p, true, &u.BackoffMax) },
		}),
		"budget": block(map[string]func(*yaml.Node, string){
			"ratio":          func(v *yaml.Node, p string) { d.number(v, p, &u.BudgetRatio) },
			"min_per_second": func(v *yaml.Node, p string) { d.number(v, p, &u.BudgetMin) },
			"ttl":            func(v *yaml.Node, p string) { d.duration(v, p, true, &u.BudgetTTL) },
		}),
		"transient_statuses":      func(v *yaml.Node, p string) { d.statuses(v, p, u) },
		"honours_idempotency_key": func(v *yaml.Node, p string) { d.boolean(v, p, &u.HonoursKey) },
		"inject_idempotency_key":  func(v *yaml.Node, p string) { d.boolean(v, p, &u.InjectKey) },
		"method_default":          func(v *yaml.Node, p string) { d.onOff(v, p, &u.MethodDefault) },
		"routes":                  func(v *yaml.Node, p string) { d.routes(v, p, u) },
		"bulkhead":                func(v *yaml.Node, p string) { d.intVal(v, p, 0, 1<<20, &u.Bulkhead) },
		"body": block(map[string]func(*yaml.Node, string){
			"memory_limit": func(v *yaml.Node, p string) { d.size(v, p, &u.MemoryLimit) },
			"spool_limit":  func(v *yaml.Node, p string) { d.size(v, p, &u.SpoolLimit) },
		}),
		"protocol": func(v *yaml.Node, p string) {
			var s val[string]
			if x, ok := d.str(v, p, &s); ok {
				switch Protocol(x) {
				case ProtocolAuto, ProtocolHTTP1, ProtocolH2, ProtocolH2C:
					u.Protocol.put(Protocol(x), s.at)
				default:
					d.fail(s.at, ErrInvalid, "%q is not http1, h2, h2c or auto", x)
				}
			}
		},
	}
	tlsFields := map[string]func(*yaml.Node, string){
		"enabled":              func(v *yaml.Node, p string) { d.boolean(v, p, &u.TLSEnabled) },
		"server_name":          func(v *yaml.Node, p string) { d.serverName(v, p, u) },
		"ca_file":              func(v *yaml.Node, p string) { d.filePath(v, p, &u.CAFile) },
		"cert_file":            func(v *yaml.Node, p string) { d.filePath(v, p, &u.CertFile) },
		"key_file":             func(v *yaml.Node, p string) { d.filePath(v, p, &u.KeyFile) },
		"insecure_skip_verify": func(v *yaml.Node, p string) { d.boolean(v, p, &u.Insecure) },
	}
	if index < 0 {
		// A server name under defaults would be sent to every destination.
		tlsFields["server_name"] = func(v *yaml.Node, p string) {
			d.fail(d.posOf(v, p), ErrUnknownField, "not allowed under defaults: set it per upstream")
		}
	}
	fields["tls"] = block(tlsFields)
	if index >= 0 {
		fields["name"] = func(v *yaml.Node, p string) { d.name(v, p, u) }
		fields["host"] = func(v *yaml.Node, p string) {
			hostGiven = true
			d.host(v, p, u)
		}
		fields["service"] = func(v *yaml.Node, p string) {
			hostGiven = true
			d.service(v, p, u)
		}
		fields["port"] = func(v *yaml.Node, p string) { d.intVal(v, p, 1, 65535, &u.Port) }
		fields["credential"] = block(map[string]func(*yaml.Node, string){
			"bearer_token_file": func(v *yaml.Node, p string) { d.filePath(v, p, &u.TokenFile) },
			"refresh_command":   func(v *yaml.Node, p string) { d.argv(v, p, u) },
			"refresh_timeout":   func(v *yaml.Node, p string) { d.duration(v, p, true, &u.RefreshTimeout) },
			"cleartext_addresses": func(v *yaml.Node, p string) {
				d.prefixes(v, p, &u.Cleartext)
			},
		})
	} else {
		fields["credential"] = func(v *yaml.Node, p string) {
			d.fail(d.posOf(v, p), ErrUnknownField,
				"not allowed under defaults: the token would be sent to every destination; set it per upstream")
		}
	}
	d.nodeOnly(fields, "name", "budget", "bulkhead", "body", "tls", "credential")
	if !d.mapping(n, path, fields) {
		return nil
	}
	if index >= 0 && !u.Host.set {
		if !hostGiven {
			d.fail(u.at, ErrInvalid, "host is required")
		}
		return nil
	}
	return u
}

func (d *decoder) onOff(n *yaml.Node, path string, dst *val[bool]) {
	s := d.scalar(n, path, "on or off", "!!str", "!!bool")
	if s == nil {
		return
	}
	at := d.posOf(s, path)
	switch s.Value {
	case "on", "true":
		dst.put(true, at)
	case "off", "false":
		dst.put(false, at)
	default:
		d.fail(at, ErrInvalid, "%q is not on or off", s.Value)
	}
}

func (d *decoder) statuses(n *yaml.Node, path string, u *rawUpstream) {
	var out []int
	lines := map[int]int{}
	ok := true
	list := d.sequence(n, path, func(_ int, e *yaml.Node, ep string) {
		x, at, good := d.integer(e, ep, 100, 599)
		switch {
		case !good:
			ok = false
		case x < 500:
			d.fail(at, ErrInvalid, "%d is not a 5xx status", x)
			ok = false
		case x >= 502 && x <= 504:
			d.fail(at, ErrInvalid, "%d is always retried for idempotent requests; do not list it", x)
			ok = false
		case lines[int(x)] > 0:
			d.fail(at, ErrDuplicate, "%d is listed twice (first at line %d)", x, lines[int(x)])
			ok = false
		default:
			lines[int(x)] = at.line
			out = append(out, int(x))
		}
	})
	if ok && list {
		slices.Sort(out)
		u.Transient.put(out, d.posOf(n, path))
	}
}

// methodToken: RFC 9110 token characters.
var methodToken = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

func (d *decoder) routes(n *yaml.Node, path string, u *rawUpstream) {
	var routes []Route // none: nil, like the embedded defaults
	seen := map[[2]string]int{}
	ok := true
	list := d.sequence(n, path, func(_ int, e *yaml.Node, ep string) {
		var method, prefix val[string]
		var idem val[bool]
		given := map[string]bool{}
		if !d.mapping(e, ep, map[string]func(*yaml.Node, string){
			"method": func(v *yaml.Node, p string) {
				given["method"] = true
				d.method(v, p, &method)
			},
			"path_prefix": func(v *yaml.Node, p string) {
				given["path_prefix"] = true
				d.pathPrefix(v, p, &prefix)
			},
			"idempotent": func(v *yaml.Node, p string) {
				given["idempotent"] = true
				d.boolean(v, p, &idem)
			},
		}) {
			ok = false
			return
		}
		at := d.posOf(e, ep)
		for _, name := range []string{"method", "path_prefix", "idempotent"} {
			if !given[name] {
				d.fail(at, ErrInvalid, "%s is required", name)
			}
		}
		if !method.set || !prefix.set || !idem.set {
			ok = false
			return
		}
		key := [2]string{method.v, prefix.v}
		if line, dup := seen[key]; dup {
			d.fail(at, ErrDuplicate, "route %s %s is given twice (first at line %d)", method.v, prefix.v, line)
			ok = false
			return
		}
		seen[key] = at.line
		routes = append(routes, Route{Method: method.v, PathPrefix: prefix.v, Idempotent: idem.v})
	})
	if !ok || !list {
		return
	}
	// Precedence: longest prefix first; at equal prefix a method before "*".
	slices.SortStableFunc(routes, func(a, b Route) int {
		if len(a.PathPrefix) != len(b.PathPrefix) {
			return len(b.PathPrefix) - len(a.PathPrefix)
		}
		if (a.Method == "*") != (b.Method == "*") {
			if a.Method == "*" {
				return 1
			}
			return -1
		}
		return 0
	})
	u.Routes.put(routes, d.posOf(n, path))
}

func (d *decoder) method(n *yaml.Node, path string, dst *val[string]) {
	var v val[string]
	m, ok := d.str(n, path, &v)
	if !ok {
		return
	}
	switch {
	case m == "*":
	case !methodToken.MatchString(m):
		d.fail(v.at, ErrInvalid, "%q is not an HTTP method or \"*\"", m)
		return
	case m != strings.ToUpper(m) && isStandardMethod(strings.ToUpper(m)):
		d.fail(v.at, ErrInvalid, "%q: methods are case-sensitive; write %s", m, strings.ToUpper(m))
		return
	}
	dst.put(m, v.at)
}

func isStandardMethod(m string) bool {
	switch m {
	case "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH":
		return true
	}
	return false
}

func (d *decoder) pathPrefix(n *yaml.Node, path string, dst *val[string]) {
	var v val[string]
	p, ok := d.str(n, path, &v)
	if !ok {
		return
	}
	switch {
	case !strings.HasPrefix(p, "/"):
		d.fail(v.at, ErrInvalid, "%q does not start with /", p)
	case strings.ContainsAny(p, "?#"):
		d.fail(v.at, ErrInvalid, "%q has a query or fragment; a prefix matches the path only", p)
	case strings.ContainsFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		d.fail(v.at, ErrInvalid, "%q has white space or control characters", p)
	case cleanPath(p) != p:
		d.fail(v.at, ErrInvalid, "%q is not a clean path (write %q)", p, cleanPath(p))
	default:
		dst.put(p, v.at)
	}
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`)

func validDNSName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if !dnsLabel.MatchString(l) {
			return false
		}
	}
	return true
}

func (d *decoder) host(n *yaml.Node, path string, u *rawUpstream) {
	var v val[string]
	h, ok := d.str(n, path, &v)
	if !ok {
		return
	}
	if u.Host.set {
		d.fail(v.at, ErrInvalid, "service and host exclude each other: an entry matches one or the other")
		return
	}
	norm := normalizeHost(h)
	if suffix, wild := strings.CutPrefix(norm, "*."); wild {
		if !validDNSName(suffix) {
			d.fail(v.at, ErrInvalid, "%q is not a host name, an IP address or *.suffix", h)
			return
		}
	} else if net.ParseIP(norm) == nil && !validDNSName(norm) {
		msg := "%q is not a host name, an IP address or *.suffix"
		if strings.Contains(norm, "*") {
			msg = "%q: a wildcard must be the whole first label, as in *.example.com"
		}
		d.fail(v.at, ErrInvalid, msg, h)
		return
	}
	if ip := net.ParseIP(norm); ip != nil {
		norm = ip.String()
	}
	u.Host.put(norm, v.at)
}

// service reads `service: NAMESPACE/NAME`, a Kubernetes Service: the
// entry matches requests the agent attributes to it (by its ClusterIP),
// on any of its ports or on `port:` alone. It stands where `host:` would
// (the two exclude each other), under the key NAMESPACE/NAME, which no
// host name can spell.
func (d *decoder) service(n *yaml.Node, path string, u *rawUpstream) {
	var v val[string]
	s, ok := d.str(n, path, &v)
	if !ok {
		return
	}
	if u.Host.set {
		d.fail(v.at, ErrInvalid, "service and host exclude each other: an entry matches one or the other")
		return
	}
	ns, name, found := strings.Cut(s, "/")
	if !found || !serviceLabel.MatchString(ns) || !serviceLabel.MatchString(name) {
		d.fail(v.at, ErrInvalid, "%q is not a Service: write namespace/name (DNS labels)", s)
		return
	}
	u.Host.put(ns+"/"+name, v.at)
}

// serviceLabel is a Kubernetes namespace or Service name (RFC 1123 label).
var serviceLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

func (d *decoder) name(n *yaml.Node, path string, u *rawUpstream) {
	var v val[string]
	s, ok := d.str(n, path, &v)
	if !ok {
		return
	}
	if s == "" || len(s) > 253 || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		d.fail(v.at, ErrInvalid, "%q: a name is 1 to 253 characters without spaces", s)
		return
	}
	u.Name.put(s, v.at)
}

func (d *decoder) serverName(n *yaml.Node, path string, u *rawUpstream) {
	var v val[string]
	s, ok := d.str(n, path, &v)
	if !ok {
		return
	}
	if !validDNSName(strings.ToLower(s)) && net.ParseIP(s) == nil {
		d.fail(v.at, ErrInvalid, "%q is not a host name", s)
		return
	}
	u.ServerName.put(s, v.at)
}

func (d *decoder) argv(n *yaml.Node, path string, u *rawUpstream) {
	var argv []string
	ok := true
	list := d.sequence(n, path, func(i int, e *yaml.Node, ep string) {
		var v val[string]
		s, good := d.str(e, ep, &v)
		if !good {
			ok = false
			return
		}
		if i == 0 && s == "" {
			d.fail(v.at, ErrInvalid, "the program is empty")
			ok = false
		}
		argv = append(argv, s)
	})
	if !ok || !list {
		return
	}
	at := d.posOf(n, path)
	if len(argv) == 0 {
		d.fail(at, ErrInvalid, "an empty command (want a list such as [\"/bin/renew-token\", \"--out\", \"/run/token\"])")
		return
	}
	u.RefreshCommand.put(argv, at)
	u.CommandDir.put(d.dir, at)
}

// prefixes decodes a list of IP addresses and CIDR prefixes (an address is
// a prefix of its full length). An empty list is a list, not an absence.
func (d *decoder) prefixes(n *yaml.Node, path string, dst *val[[]netip.Prefix]) {
	list := []netip.Prefix{}
	ok := true
	isList := d.sequence(n, path, func(i int, e *yaml.Node, ep string) {
		var v val[string]
		s, good := d.str(e, ep, &v)
		if !good {
			ok = false
			return
		}
		pf, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil || a.Zone() != "" {
				d.fail(v.at, ErrInvalid, "%q is not an IP address or a CIDR prefix", s)
				ok = false
				return
			}
			pf = netip.PrefixFrom(a, a.BitLen())
		}
		if pf.Addr().Is4In6() && pf.Bits() >= 96 {
			pf = netip.PrefixFrom(pf.Addr().Unmap(), pf.Bits()-96)
		}
		pf = pf.Masked()
		list = append(list, pf)
	})
	if ok && isList {
		dst.put(list, d.posOf(n, path))
	}
}

// direct decodes the direct: section.
func (d *decoder) direct(n *yaml.Node, path string, dst *rawDirect) {
	d.mapping(n, path, map[string]func(*yaml.Node, string){
		"ports": func(v *yaml.Node, p string) { d.ports(v, p, &dst.Ports) },
		"cidrs": func(v *yaml.Node, p string) { d.prefixes(v, p, &dst.CIDRs) },
		"default_ports": func(v *yaml.Node, p string) {
			d.boolean(v, p, &dst.DefaultPorts)
		},
		"learn": func(v *yaml.Node, p string) {
			d.mapping(v, p, map[string]func(*yaml.Node, string){
				"enabled": func(v *yaml.Node, p string) { d.boolean(v, p, &dst.Learn) },
				"ttl":     func(v *yaml.Node, p string) { d.duration(v, p, true, &dst.LearnTTL) },
			})
		},
	})
}

// ports decodes a list of TCP ports (1..65535), each at most once.
func (d *decoder) ports(n *yaml.Node, path string, dst *val[[]uint16]) {
	list := []uint16{}
	seen := map[int64]int{}
	ok := true
	isList := d.sequence(n, path, func(i int, e *yaml.Node, ep string) {
		x, at, good := d.integer(e, ep, 1, 65535)
		if !good {
			ok = false
			return
		}
		if first, dup := seen[x]; dup {
			d.fail(at, ErrDuplicate, "port %d given twice (first at line %d)", x, first)
			ok = false
			return
		}
		seen[x] = at.line
		list = append(list, uint16(x))
	})
	if ok && isList {
		dst.put(list, d.posOf(n, path))
	}
}
