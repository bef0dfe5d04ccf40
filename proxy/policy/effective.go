package policy

import "time"

// Layers a resolved field may come from (Field.From), most general first.
const (
	FromBuiltin     = "builtin"      // the embedded defaults
	FromDefaults    = "defaults"     // the policy file's defaults block
	FromPodDefaults = "pod defaults" // a pod override's defaults block
	FromEntry       = "entry"        // the matching upstream entry
	FromPodEntry    = "pod entry"    // the pod override's entry
	// FromDestination: the budget name of an upstream the policy does not
	// name, which Match names after the destination (host:port).
	FromDestination = "destination"
)

// Field is one resolved field of an Upstream and where its value came
// from, for `egret policy`.
type Field struct {
	// Name is the field's path as the policy file writes it
	// ("max_attempts", "budget.ratio").
	Name string `json:"field"`
	// Value as the policy file would write it: durations as "250ms",
	// sizes in bytes, lists as lists.
	Value any `json:"value"`
	// From is the layer (FromBuiltin, FromDefaults, ...); File and Line
	// where it was written ("" and 0 for FromBuiltin).
	From string `json:"from"`
	File string `json:"file"`
	Line int    `json:"line"`
}

// fieldOrigin is a resolved field's layer and position.
type fieldOrigin struct {
	from string
	at   pos
}

// layerOrigins names the layers of o: ranks below docs are defaults
// blocks, the others entries; the first document is the node's file, the
// next ones pod overrides (build's ranks).
func layerOrigins(o origins, docs int) map[string]fieldOrigin {
	out := make(map[string]fieldOrigin, len(o))
	for name, g := range o {
		var from string
		switch {
		case g.rank == 0:
			from = FromDefaults
		case g.rank < docs:
			from = FromPodDefaults
		case g.rank == docs:
			from = FromEntry
		default:
			from = FromPodEntry
		}
		out[name] = fieldOrigin{from, g.at}
	}
	return out
}

func dur(d time.Duration) string { return d.String() }

// fields are the resolved fields Fields reports, in the policy file's
// order, with how each is read from an Upstream.
var fields = []struct {
	name string
	get  func(u *Upstream) any
}{
	{"name", func(u *Upstream) any { return u.Name }},
	{"max_attempts", func(u *Upstream) any { return u.MaxAttempts }},
	{"timeout", func(u *Upstream) any { return dur(u.Timeout) }},
	{"attempt_timeout", func(u *Upstream) any { return dur(u.AttemptTimeout) }},
	{"min_attempt", func(u *Upstream) any { return dur(u.MinAttempt) }},
	{"backoff.kind", func(u *Upstream) any { return u.Backoff.Kind.String() }},
	{"backoff.base", func(u *Upstream) any { return dur(u.Backoff.Base) }},
	{"backoff.max", func(u *Upstream) any { return dur(u.Backoff.Max) }},
	{"budget.ratio", func(u *Upstream) any { return u.Budget.Ratio }},
	{"budget.min_per_second", func(u *Upstream) any { return u.Budget.MinPerSecond }},
	{"budget.ttl", func(u *Upstream) any { return dur(u.Budget.TTL) }},
	{"transient_statuses", func(u *Upstream) any { return append([]int{}, u.TransientStatuses...) }},
	{"honours_idempotency_key", func(u *Upstream) any { return u.HonoursIdempotencyKey }},
	{"inject_idempotency_key", func(u *Upstream) any { return u.InjectIdempotencyKey }},
	{"method_default", func(u *Upstream) any { return u.MethodDefault }},
	{"routes", func(u *Upstream) any {
		rs := make([]map[string]any, 0, len(u.Routes))
		for _, r := range u.Routes {
			rs = append(rs, map[string]any{"method": r.Method, "path_prefix": r.PathPrefix, "idempotent": r.Idempotent})
		}
		return rs
	}},
	{"bulkhead", func(u *Upstream) any { return u.Bulkhead }},
	{"body.memory_limit", func(u *Upstream) any { return u.Body.MemoryLimit }},
	{"body.spool_limit", func(u *Upstream) any { return u.Body.SpoolLimit }},
	{"protocol", func(u *Upstream) any { return string(u.Protocol) }},
	{"tls.enabled", func(u *Upstream) any { return u.TLS.Enabled }},
	{"tls.server_name", func(u *Upstream) any { return u.TLS.ServerName }},
	{"tls.ca_file", func(u *Upstream) any { return u.TLS.CAFile }},
	{"tls.cert_file", func(u *Upstream) any { return u.TLS.CertFile }},
	{"tls.key_file", func(u *Upstream) any { return u.TLS.KeyFile }},
	{"tls.insecure_skip_verify", func(u *Upstream) any { return u.TLS.InsecureSkipVerify }},
	{"credential.bearer_token_file", func(u *Upstream) any { return u.Credential.BearerTokenFile }},
	{"credential.refresh_command", func(u *Upstream) any { return append([]string{}, u.Credential.RefreshCommand...) }},
	{"credential.refresh_timeout", func(u *Upstream) any { return dur(u.Credential.RefreshTimeout) }},
	{"credential.dir", func(u *Upstream) any { return u.Credential.Dir }},
	{"credential.cleartext_addresses", func(u *Upstream) any {
		out := make([]string, 0, len(u.Credential.CleartextAddresses))
		for _, p := range u.Credential.CleartextAddresses {
			out = append(out, p.String())
		}
		return out
	}},
}

// Fields returns every resolved field of u with the layer it came from.
// The name of an entry with a fixed host and port comes from its entry;
// that of an upstream Match named after the destination, FromDestination.
func (u *Upstream) Fields() []Field {
	out := make([]Field, 0, len(fields))
	for _, f := range fields {
		fv := Field{Name: f.name, Value: f.get(u), From: FromBuiltin}
		if o, ok := u.origins[f.name]; ok {
			fv.From, fv.File, fv.Line = o.from, o.at.file, o.at.line
		} else if f.name == "name" && !u.named {
			fv.From = FromDestination
		}
		out = append(out, fv)
	}
	return out
}

// Pattern is what the upstream matches as the policy file writes it:
// "host:port", "host" (any port), or "defaults".
func (u *Upstream) Pattern() string {
	if u.Host == "" {
		return "defaults"
	}
	return hostKey{u.Host, u.Port}.String()
}
