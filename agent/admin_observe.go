package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
)

// ErrDest is returned for a destination `egret policy` cannot read.
var ErrDest = errors.New("bad destination")

// Observable is an AdminSource whose requests can be observed (GET
// /observe).
type Observable interface {
	Tap() *proxy.Tap
}

// PolicyLookup is an AdminSource that tells the policy in force (GET
// /policy): the node's for pod "", else the pod's (the node's with its
// override).
type PolicyLookup interface {
	PolicyFor(pod string) (*policy.Policy, error)
}

// Tap implements Observable: the node's tap, shared by every pod.
func (a *Agent) Tap() *proxy.Tap { return a.shared.Tap }

// PolicyFor implements PolicyLookup. pod is a pod's name (namespace/name)
// or, when that is unambiguous, its name alone.
func (a *Agent) PolicyFor(pod string) (*policy.Policy, error) {
	if pod == "" {
		if a.cfg.Policy == nil {
			return policy.Default(), nil
		}
		return a.cfg.Policy.Current(), nil
	}
	a.mu.Lock()
	var found []*podState
	for name, ps := range a.pods {
		if name == pod || strings.HasSuffix(name, "/"+pod) {
			found = append(found, ps)
			if name == pod {
				found = found[len(found)-1:]
				break
			}
		}
	}
	a.mu.Unlock()
	switch {
	case len(found) == 0:
		return nil, fmt.Errorf("%w: %s", ErrNoPod, pod)
	case len(found) > 1:
		return nil, fmt.Errorf("%w: %s names pods in %d namespaces: give namespace/name", ErrNoPod, pod, len(found))
	case found[0].policy == nil:
		return nil, fmt.Errorf("%w: %s is not running", ErrNoPod, pod)
	}
	return found[0].policy.Current(), nil
}

// Tap implements Observable.
func (s *Standalone) Tap() *proxy.Tap { return s.Server.Tap() }

// PolicyFor implements PolicyLookup: a lone proxy has no pods.
func (s *Standalone) PolicyFor(pod string) (*policy.Policy, error) {
	if pod != "" {
		return nil, fmt.Errorf("%w: %s (egret proxy has no pods)", ErrNoPod, pod)
	}
	return s.Server.Policy().Current(), nil
}

// LostEvents is the line GET /observe writes, between events, when the
// observer fell behind: how many events it missed since the last such
// line.
type LostEvents struct {
	LostEvents uint64 `json:"lost_events"`
}

// addObserve adds GET /observe and GET /policy to an admin API when src
// offers them.
//
//	GET /observe?last=N&follow=1&pod=&namespace=&upstream=&outcome=
//	    JSON lines: the last N requests kept (proxy.Event), then, with
//	    follow, each request as it finishes, and LostEvents lines when
//	    the reader fell behind by more than the observer's queue
//	GET /policy?dest=HOST:PORT|URL&pod=NAME
//	    PolicyView: the effective policy for a destination
func addObserve(mux *http.ServeMux, src AdminSource) {
	if o, ok := src.(Observable); ok {
		mux.HandleFunc("GET /observe", func(w http.ResponseWriter, r *http.Request) { observe(w, r, o.Tap()) })
	}
	if pl, ok := src.(PolicyLookup); ok {
		mux.HandleFunc("GET /policy", func(w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query()
			p, err := pl.PolicyFor(q.Get("pod"))
			if err != nil {
				writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
				return
			}
			v, err := EffectivePolicy(p, q.Get("dest"))
			if err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
				return
			}
			v.Pod = q.Get("pod")
			writeJSON(w, http.StatusOK, v)
		})
	}
}

// ObserveQuery reads GET /observe's parameters.
func ObserveQuery(q url.Values) (f proxy.Filter, last int, follow bool, err error) {
	f = proxy.Filter{Namespace: q.Get("namespace"), Pod: q.Get("pod"), Upstream: q.Get("upstream"), Outcome: q.Get("outcome")}
	if f.Outcome != "" && !slices.Contains(proxy.Outcomes, f.Outcome) {
		return f, 0, false, fmt.Errorf("outcome %q: expected one of %s", f.Outcome, strings.Join(proxy.Outcomes, ", "))
	}
	if s := q.Get("last"); s != "" {
		if last, err = strconv.Atoi(s); err != nil || last < 0 {
			return f, 0, false, fmt.Errorf("last %q: expected a count, 0 or more", s)
		}
	}
	if s := q.Get("follow"); s != "" {
		if follow, err = strconv.ParseBool(s); err != nil {
			return f, 0, false, fmt.Errorf("follow %q: expected 1 or 0", s)
		}
	}
	return f, last, follow, nil
}

func observe(w http.ResponseWriter, r *http.Request, tap *proxy.Tap) {
	f, last, follow, err := ObserveQuery(r.URL.Query())
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	if tap == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "this egret has no request tap"})
		return
	}
	past, o := tap.Observe(f, last, follow, 0)
	if o != nil {
		defer o.Close()
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	for i := range past {
		if enc.Encode(&past[i]) != nil {
			return
		}
	}
	if o == nil {
		return
	}
	if rc.Flush() != nil {
		return
	}
	// Drops are told as soon as they are seen, and at least every second
	// while no event comes.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var told uint64
	tell := func() bool {
		if d := o.Dropped(); d > told {
			if enc.Encode(LostEvents{d - told}) != nil {
				return false
			}
			told = d
		}
		return true
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
			if !tell() || rc.Flush() != nil {
				return
			}
		case e, ok := <-o.C():
			if !ok {
				return
			}
			if enc.Encode(&e) != nil {
				return
			}
			// Whatever else is queued goes in the same write.
			for more := true; more; {
				select {
				case e, ok := <-o.C():
					if !ok {
						return
					}
					if enc.Encode(&e) != nil {
						return
					}
				default:
					more = false
				}
			}
			if !tell() || rc.Flush() != nil {
				return
			}
		}
	}
}

// PolicyView is the effective policy for a destination (GET /policy,
// `egret policy`).
type PolicyView struct {
	// Dest is the destination asked about, as host:port ("": the
	// defaults).
	Dest string `json:"dest"`
	// Pod is the pod asked for ("": the node's policy).
	Pod string `json:"pod"`
	// Policy names the policy in force: its file (and pod override), or
	// "embedded defaults".
	Policy string `json:"policy"`
	// Entry is the upstream entry that matched ("defaults" for none).
	Entry string `json:"entry"`
	// Upstream is the budget's name: what `egret upstreams` and the
	// metrics call it.
	Upstream string         `json:"upstream"`
	Fields   []policy.Field `json:"fields"`
}

// ParseDest reads a destination as `egret policy` takes it: HOST:PORT,
// [IPv6]:PORT, or a URL (http:// and https:// imply 80 and 443).
func ParseDest(dest string) (host string, port int, err error) {
	if dest == "" {
		return "", 0, fmt.Errorf("%w: none given: expected HOST:PORT or a URL", ErrDest)
	}
	hp := dest
	def := ""
	if strings.Contains(dest, "://") {
		u, err := url.Parse(dest)
		if err != nil || u.Host == "" {
			return "", 0, fmt.Errorf("%w: %q: not a URL with a host", ErrDest, dest)
		}
		switch u.Scheme {
		case "http":
			def = "80"
		case "https":
			def = "443"
		}
		hp = u.Host
		if u.Port() == "" {
			if def == "" {
				return "", 0, fmt.Errorf("%w: %q: no port, and scheme %q implies none", ErrDest, dest, u.Scheme)
			}
			hp = net.JoinHostPort(u.Hostname(), def)
		}
	}
	h, p, err := net.SplitHostPort(hp)
	if err != nil || h == "" {
		return "", 0, fmt.Errorf("%w: %q: expected HOST:PORT (such as api.example.com:443) or a URL", ErrDest, dest)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, fmt.Errorf("%w: %q: port %q is not a port number", ErrDest, dest, p)
	}
	return h, port, nil
}

// EffectivePolicy is the policy p gives dest (ParseDest), each field with
// the layer it came from.
// An empty dest gives the defaults, those of a destination no entry
// matches.
func EffectivePolicy(p *policy.Policy, dest string) (PolicyView, error) {
	if dest == "" {
		return PolicyView{Policy: p.Source, Entry: p.Defaults.Pattern(), Fields: p.Defaults.Fields()}, nil
	}
	host, port, err := ParseDest(dest)
	if err != nil {
		return PolicyView{}, err
	}
	u := p.Match(host, port)
	return PolicyView{
		Dest: net.JoinHostPort(host, strconv.Itoa(port)), Policy: p.Source,
		Entry: u.Pattern(), Upstream: u.Name, Fields: u.Fields(),
	}, nil
}

// About is what GET /about says of the egret that answers: its version
// and the kernel it runs on (`egret status`).
type About struct {
	Version string `json:"version"`
	Go      string `json:"go"`
	Kernel  string `json:"kernel"`
	// EBPF is each kernel feature the agent uses (bpfload.Features);
	// null for egret proxy, which uses none.
	EBPF []bpfload.Feature `json:"ebpf"`
}

// WithAbout adds GET /about to an admin API h: version is the binary's;
// ebpf says whether to probe the kernel's eBPF features (the agent).
func WithAbout(h http.Handler, version string, ebpf bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("GET /about", func(w http.ResponseWriter, r *http.Request) {
		a := About{Version: version, Go: runtime.Version(), Kernel: bpfload.KernelRelease()}
		if ebpf {
			a.EBPF = bpfload.Features()
		}
		writeJSON(w, http.StatusOK, a)
	})
	return mux
}
