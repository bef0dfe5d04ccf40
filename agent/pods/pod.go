// Package pods describes the workloads the node agent puts behind egret and
// the sources that say which exist.
//
// A Pod is a cgroup v2 directory (whose processes' TCP connects are
// redirected) plus a network namespace (where the pod's egret listener is
// opened and from where its upstreams are dialed). A Source streams Events:
// first the pods that exist (Added), then Synced once the initial set is
// complete, then changes as they happen. Implementations: Memory (tests,
// `egret run`), File (a YAML file, reloaded on change); a Kubernetes source
// (pods on this node opted in by annotation) fits the same interface.
package pods

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Pod is one workload put behind egret.
type Pod struct {
	// Name identifies the pod to the source (namespace/name on
	// Kubernetes). Unique within a source.
	Name string
	// Workload is the pod's owner, as kind/name in kubectl's form
	// ("deployment/web", "statefulset/db", "daemonset/agent",
	// "job/backup"); empty when unknown. It labels the pod's metrics; a
	// change of it alone is not an update (Equal ignores it).
	Workload string
	// Cgroup is the pod's cgroup v2 directory, e.g.
	// /sys/fs/cgroup/unified/kubepods/pod1234. Connects made by processes
	// in it (or below it) are redirected.
	Cgroup string
	// Netns is a path to the pod's network namespace (/proc/PID/ns/net,
	// /run/netns/NAME); empty means the agent's own namespace.
	Netns string
	// ListenPort is the port of the pod's egret listener on 127.0.0.1 and
	// ::1 inside its namespace; 0 takes the agent's default.
	ListenPort uint16
	// Exclude lists destinations that always go direct.
	Exclude Exclusions
	// RedirectLoopback also redirects connects to 127.0.0.0/8 and ::1
	// (by default they go direct).
	RedirectLoopback bool
	// Policy is a policy override (YAML, the policy file's schema) laid
	// over the node's policy for this pod only; empty for none.
	Policy []byte
	// Learn says whether destinations egret passes through (its proxy
	// sniffed them as not HTTP/1.x) are learned, so that the pod's next
	// connects to them go direct. On by default.
	Learn Learning
	// Limits bound what the pod may hold of egret at once; zero fields
	// take the agent's defaults.
	Limits Limits
}

// Learning configures learned-direct destinations for a pod. Neither Off
// nor On: the node policy's direct.learn.enabled decides (on by default).
type Learning struct {
	// Off: every connect not excluded keeps coming to egret, and a
	// refused destination egret passes through reaches the pod as a reset
	// (see agent/README.md).
	Off bool
	// On: learning for this pod even when the node policy turns it off.
	On bool
	// TTL is how long a learned destination stays direct; 0 takes the
	// node policy's direct.learn.ttl.
	TTL time.Duration
}

// Limits are a pod's own limits (zero: the agent's default).
type Limits struct {
	// Conns: client connections open at once; one more is refused.
	Conns int
	// InFlight: requests being served at once; one more gets 503 not-sent.
	InFlight int
	// SpoolBytes: request-body bytes held at once for replays; a body
	// that would pass it gets 503 not-sent.
	SpoolBytes int64
}

// Exclusions are destinations a pod reaches directly, never through egret.
type Exclusions struct {
	Ports []uint16
	CIDRs []netip.Prefix
	// NoDefaultPorts drops the agent's default excluded ports (the
	// server-speaks-first protocols: SMTP, MySQL, ...); DefaultPorts keeps
	// them even when the node policy's direct.default_ports drops them.
	// Neither: the node policy decides.
	NoDefaultPorts bool
	DefaultPorts   bool
}

// Namespace is the part of Name before its first "/" (empty if none).
func (p Pod) Namespace() string {
	if i := strings.IndexByte(p.Name, '/'); i >= 0 {
		return p.Name[:i]
	}
	return ""
}

// ShortName is Name without its namespace.
func (p Pod) ShortName() string {
	if i := strings.IndexByte(p.Name, '/'); i >= 0 {
		return p.Name[i+1:]
	}
	return p.Name
}

// Equal reports whether p and q describe the same pod in every field but
// Workload.
func (p Pod) Equal(q Pod) bool {
	return p.Name == q.Name && p.Cgroup == q.Cgroup && p.Netns == q.Netns &&
		p.ListenPort == q.ListenPort && p.RedirectLoopback == q.RedirectLoopback &&
		slices.Equal(p.Exclude.Ports, q.Exclude.Ports) &&
		slices.Equal(p.Exclude.CIDRs, q.Exclude.CIDRs) &&
		p.Exclude.NoDefaultPorts == q.Exclude.NoDefaultPorts && p.Exclude.DefaultPorts == q.Exclude.DefaultPorts &&
		string(p.Policy) == string(q.Policy) && p.Learn == q.Learn && p.Limits == q.Limits
}

// Validate checks the fields a source cannot leave wrong.
func (p Pod) Validate() error {
	if p.Name == "" {
		return fmt.Errorf("%w: pod without a name", ErrInvalid)
	}
	if p.Cgroup == "" {
		return fmt.Errorf("%w: pod %s: no cgroup", ErrInvalid, p.Name)
	}
	for _, c := range p.Exclude.CIDRs {
		if !c.IsValid() {
			return fmt.Errorf("%w: pod %s: invalid excluded CIDR", ErrInvalid, p.Name)
		}
	}
	if p.Learn.On && p.Learn.Off {
		return fmt.Errorf("%w: pod %s: learning both on and off", ErrInvalid, p.Name)
	}
	if p.Exclude.DefaultPorts && p.Exclude.NoDefaultPorts {
		return fmt.Errorf("%w: pod %s: default excluded ports both kept and dropped", ErrInvalid, p.Name)
	}
	if p.Learn.TTL < 0 {
		return fmt.Errorf("%w: pod %s: negative learn TTL %s", ErrInvalid, p.Name, p.Learn.TTL)
	}
	if p.Limits.Conns < 0 || p.Limits.InFlight < 0 || p.Limits.SpoolBytes < 0 {
		return fmt.Errorf("%w: pod %s: negative limit", ErrInvalid, p.Name)
	}
	return nil
}

// EventKind says what happened to a pod.
type EventKind uint8

// Event kinds.
const (
	// Added: a pod the agent has not seen from this source.
	Added EventKind = iota + 1
	// Updated: a pod already added changed (Event.Pod is the new state).
	Updated
	// Removed: the pod is gone (Event.Pod is its last state).
	Removed
	// Synced: every pod that existed when the source started has been
	// sent; the agent may now forget pinned pods the source does not know.
	Synced
)

func (k EventKind) String() string {
	switch k {
	case Added:
		return "added"
	case Updated:
		return "updated"
	case Removed:
		return "removed"
	case Synced:
		return "synced"
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event is one change of a source.
type Event struct {
	Kind EventKind
	Pod  Pod
}

// Source streams pod events.
type Source interface {
	// Run sends the current pods as Added, then Synced, then every change,
	// until ctx ends (it then returns ctx.Err()) or the source fails. A
	// Source may be Run once at a time.
	Run(ctx context.Context, events chan<- Event) error
}

// Sentinel errors; match them with errors.Is.
var (
	// ErrInvalid: a pod description that cannot be used.
	ErrInvalid = errors.New("pods: invalid pod")
	// ErrFile: the pods file cannot be read or parsed (the error names the
	// file and the line).
	ErrFile = errors.New("pods: bad pods file")
)

// diff returns the events that turn old into cur, in name order of cur
// (removals first).
func diff(old, cur map[string]Pod) []Event {
	var ev []Event
	for _, name := range sortedNames(old) {
		if _, ok := cur[name]; !ok {
			ev = append(ev, Event{Kind: Removed, Pod: old[name]})
		}
	}
	for _, name := range sortedNames(cur) {
		p := cur[name]
		o, ok := old[name]
		switch {
		case !ok:
			ev = append(ev, Event{Kind: Added, Pod: p})
		case !o.Equal(p):
			ev = append(ev, Event{Kind: Updated, Pod: p})
		}
	}
	return ev
}

func sortedNames(m map[string]Pod) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
