package policy

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"time"
)

// origin is where a resolved field got its value; rank orders the layers
// (a higher rank was applied later). Fields absent from origins are the
// embedded defaults.
type origin struct {
	at   pos
	rank int
}

type origins map[string]origin

func take[T any](dst *T, v val[T], name string, o origins, rank int) {
	if v.set {
		*dst = v.v
		o[name] = origin{v.at, rank}
	}
}

// apply lays one layer over u.
func apply(u *Upstream, r *rawUpstream, o origins, rank int) {
	take(&u.MaxAttempts, r.MaxAttempts, "max_attempts", o, rank)
	take(&u.Timeout, r.Timeout, "timeout", o, rank)
	take(&u.AttemptTimeout, r.AttemptTimeout, "attempt_timeout", o, rank)
	take(&u.MinAttempt, r.MinAttempt, "min_attempt", o, rank)
	take(&u.Backoff.Kind, r.BackoffKind, "backoff.kind", o, rank)
	take(&u.Backoff.Base, r.BackoffBase, "backoff.base", o, rank)
	take(&u.Backoff.Max, r.BackoffMax, "backoff.max", o, rank)
	take(&u.Budget.Ratio, r.BudgetRatio, "budget.ratio", o, rank)
	take(&u.Budget.MinPerSecond, r.BudgetMin, "budget.min_per_second", o, rank)
	take(&u.Budget.TTL, r.BudgetTTL, "budget.ttl", o, rank)
	take(&u.TransientStatuses, r.Transient, "transient_statuses", o, rank)
	take(&u.HonoursIdempotencyKey, r.HonoursKey, "honours_idempotency_key", o, rank)
	take(&u.InjectIdempotencyKey, r.InjectKey, "inject_idempotency_key", o, rank)
	take(&u.MethodDefault, r.MethodDefault, "method_default", o, rank)
	take(&u.Routes, r.Routes, "routes", o, rank)
	take(&u.Bulkhead, r.Bulkhead, "bulkhead", o, rank)
	take(&u.Body.MemoryLimit, r.MemoryLimit, "body.memory_limit", o, rank)
	take(&u.Body.SpoolLimit, r.SpoolLimit, "body.spool_limit", o, rank)
	take(&u.Protocol, r.Protocol, "protocol", o, rank)
	take(&u.TLS.Enabled, r.TLSEnabled, "tls.enabled", o, rank)
	take(&u.TLS.ServerName, r.ServerName, "tls.server_name", o, rank)
	take(&u.TLS.CAFile, r.CAFile, "tls.ca_file", o, rank)
	take(&u.TLS.CertFile, r.CertFile, "tls.cert_file", o, rank)
	take(&u.TLS.KeyFile, r.KeyFile, "tls.key_file", o, rank)
	take(&u.TLS.InsecureSkipVerify, r.Insecure, "tls.insecure_skip_verify", o, rank)
	take(&u.Credential.BearerTokenFile, r.TokenFile, "credential.bearer_token_file", o, rank)
	take(&u.Credential.RefreshCommand, r.RefreshCommand, "credential.refresh_command", o, rank)
	take(&u.Credential.RefreshTimeout, r.RefreshTimeout, "credential.refresh_timeout", o, rank)
	take(&u.Credential.Dir, r.CommandDir, "credential.dir", o, rank)
	take(&u.Credential.CleartextAddresses, r.Cleartext, "credential.cleartext_addresses", o, rank)
	take(&u.Name, r.Name, "name", o, rank)
}

// resolver builds one Policy and gathers its problems.
type resolver struct {
	errs     Errors
	seen     map[string]bool
	warnings []string
	files    []string
	entry    pos // the entry being resolved, for problems with no field
}

func (r *resolver) add(e *Error) {
	if s := e.Error(); !r.seen[s] {
		r.seen[s] = true
		r.errs = append(r.errs, e)
	}
}

func (r *resolver) errAt(at pos, sentinel error, format string, args ...any) {
	r.add(&Error{File: at.file, Line: at.line, Column: at.col, Path: at.path,
		Msg: fmt.Sprintf(format, args...), Err: sentinel})
}

// conflict reports a contradiction at the field among names that was set
// last (the first such in names on a tie).
func (r *resolver) conflict(o origins, names []string, format string, args ...any) {
	best, found := origin{}, false
	for _, n := range names {
		if g, ok := o[n]; ok && (!found || g.rank > best.rank) {
			best, found = g, true
		}
	}
	at := r.entry
	if found {
		at = best.at
	}
	r.errAt(at, ErrConflict, format, args...)
}

// where says where a field's value came from, for messages.
func where(o origins, name string) string {
	if g, ok := o[name]; ok {
		return fmt.Sprintf("%s at %s:%d", name, g.at.file, g.at.line)
	}
	return name + " by default"
}

// check reports contradictions between the resolved fields of u.
func (r *resolver) check(u *Upstream, o origins) {
	if u.Timeout > 0 && u.AttemptTimeout > u.Timeout {
		r.conflict(o, []string{"attempt_timeout", "timeout"},
			"attempt_timeout %s is longer than the overall timeout %s (%s)", u.AttemptTimeout, u.Timeout, where(o, "timeout"))
	}
	if u.Timeout > 0 && u.MinAttempt >= u.Timeout {
		r.conflict(o, []string{"min_attempt", "timeout"},
			"min_attempt %s leaves no room in the overall timeout %s (%s)", u.MinAttempt, u.Timeout, where(o, "timeout"))
	}
	if u.Backoff.Base > u.Backoff.Max {
		r.conflict(o, []string{"backoff.base", "backoff.max"},
			"backoff.base %s is more than backoff.max %s", u.Backoff.Base, u.Backoff.Max)
	}
	if u.MaxAttempts > 1 && u.Budget.Ratio == 0 && u.Budget.MinPerSecond == 0 {
		r.conflict(o, []string{"budget.ratio", "budget.min_per_second", "max_attempts"},
			"the budget allows no retry (ratio and min_per_second are 0) but max_attempts is %d; set max_attempts: 1 to turn retries off", u.MaxAttempts)
	}
	if u.InjectIdempotencyKey && !u.HonoursIdempotencyKey {
		r.conflict(o, []string{"inject_idempotency_key", "honours_idempotency_key"},
			"inject_idempotency_key needs honours_idempotency_key: true (a key the upstream ignores makes nothing safe to retry)")
	}
	if u.Body.SpoolLimit != 0 && u.Body.SpoolLimit < u.Body.MemoryLimit {
		r.conflict(o, []string{"body.spool_limit", "body.memory_limit"},
			"body.spool_limit %d is less than body.memory_limit %d (use 0 to turn spooling off)", u.Body.SpoolLimit, u.Body.MemoryLimit)
	}
	switch {
	case u.Protocol == ProtocolH2 && !u.TLS.Enabled:
		r.conflict(o, []string{"protocol", "tls.enabled"},
			"protocol h2 needs tls.enabled: true (use h2c for HTTP/2 over cleartext)")
	case u.Protocol == ProtocolH2C && u.TLS.Enabled:
		r.conflict(o, []string{"protocol", "tls.enabled"},
			"protocol h2c is cleartext HTTP/2 but tls.enabled is true (use h2 or auto)")
	}
	if !u.TLS.Enabled {
		// A field set where TLS is off (or later) is a mistake; one
		// inherited from a layer that an entry overrides with enabled:
		// false is dropped with the rest of TLS.
		off, offSet := o["tls.enabled"]
		for _, f := range []string{"tls.server_name", "tls.ca_file", "tls.cert_file", "tls.key_file", "tls.insecure_skip_verify"} {
			if g, ok := o[f]; ok && (!offSet || g.rank >= off.rank) {
				r.conflict(o, []string{f, "tls.enabled"}, "%s is set but tls.enabled is not true", f)
			}
		}
		u.TLS = TLS{}
	}
	if (u.TLS.CertFile == "") != (u.TLS.KeyFile == "") {
		r.conflict(o, []string{"tls.cert_file", "tls.key_file"}, "tls.cert_file and tls.key_file go together")
	}
	if u.TLS.InsecureSkipVerify && u.TLS.CAFile != "" {
		r.conflict(o, []string{"tls.insecure_skip_verify", "tls.ca_file"},
			"tls.insecure_skip_verify turns off the check tls.ca_file is for")
	}
	if u.Credential.BearerTokenFile == "" {
		for _, f := range []string{"credential.refresh_command", "credential.refresh_timeout", "credential.cleartext_addresses"} {
			if _, ok := o[f]; ok {
				r.conflict(o, []string{f}, "%s needs credential.bearer_token_file", f)
			}
		}
	}
	_, listed := o["credential.cleartext_addresses"]
	switch {
	case u.Credential.BearerTokenFile != "" && !u.TLS.Enabled && !listed:
		// Without TLS nothing proves who receives the token: only an
		// address the policy author listed may.
		r.conflict(o, []string{"credential.bearer_token_file", "tls.enabled"},
			"a bearer token without tls would be sent in cleartext to whatever the destination is: "+
				"set tls.enabled: true, or list the addresses it may go to in credential.cleartext_addresses")
	case listed && u.TLS.Enabled:
		r.conflict(o, []string{"credential.cleartext_addresses", "tls.enabled"},
			"credential.cleartext_addresses is for a token sent without tls, but tls.enabled is true")
	}
}

// finish loads the files u names and builds its TLS configuration and
// refresher. label names u in warnings.
func (r *resolver) finish(u *Upstream, o origins, label string) {
	if u.Credential.RefreshTimeout == 0 {
		u.Credential.RefreshTimeout = DefaultRefreshTimeout
	}
	if u.TLS.Enabled {
		u.tlsConfig, u.tlsID = r.tlsConfig(u, o)
		if u.TLS.InsecureSkipVerify {
			r.warnings = append(r.warnings, label+": tls.insecure_skip_verify: the upstream's certificate is not checked")
		}
	}
	if c := u.Credential; c.BearerTokenFile != "" {
		tok, err := readToken(c.BearerTokenFile)
		if err != nil && (len(c.RefreshCommand) == 0 || !errors.Is(err, os.ErrNotExist)) {
			at := o["credential.bearer_token_file"].at
			r.errAt(at, ErrFile, "%v", err)
		}
		u.refresher = newRefresher(c, tok)
		u.refresh = u.refresher.authorize
	}
}

// tlsConfig builds u's TLS client configuration from its files, and a
// digest of everything the configuration was built from (settings and file
// contents).
func (r *resolver) tlsConfig(u *Upstream, o origins) (*tls.Config, string) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         u.TLS.ServerName,
		InsecureSkipVerify: u.TLS.InsecureSkipVerify, //nolint:gosec // an explicit, warned-about setting
	}
	switch u.Protocol {
	case ProtocolHTTP1:
		cfg.NextProtos = []string{"http/1.1"}
	case ProtocolH2:
		cfg.NextProtos = []string{"h2"}
	default:
		cfg.NextProtos = []string{"h2", "http/1.1"}
	}
	id := sha256.New()
	fmt.Fprintf(id, "%q %q %v\n", cfg.ServerName, cfg.NextProtos, cfg.InsecureSkipVerify)
	ok := true
	if f := u.TLS.CAFile; f != "" {
		r.files = append(r.files, f)
		pem, err := os.ReadFile(f)
		fmt.Fprintf(id, "%d\n", len(pem))
		id.Write(pem)
		if err != nil {
			r.errAt(o["tls.ca_file"].at, ErrFile, "%v", err)
			ok = false
		} else {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				r.errAt(o["tls.ca_file"].at, ErrFile, "%s holds no PEM certificate", f)
				ok = false
			}
			cfg.RootCAs = pool
		}
	}
	if u.TLS.CertFile != "" && u.TLS.KeyFile != "" {
		r.files = append(r.files, u.TLS.CertFile, u.TLS.KeyFile)
		pair, err := loadKeyPair(u.TLS.CertFile, u.TLS.KeyFile, id)
		if err != nil {
			r.errAt(o["tls.cert_file"].at, ErrFile, "client certificate: %v", err)
			ok = false
		} else {
			cfg.Certificates = []tls.Certificate{pair}
		}
	}
	if !ok {
		return nil, ""
	}
	return cfg, hex.EncodeToString(id.Sum(nil))
}

// loadKeyPair is tls.LoadX509KeyPair that also writes the two files'
// contents to id.
func loadKeyPair(certFile, keyFile string, id io.Writer) (tls.Certificate, error) {
	cert, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	fmt.Fprintf(id, "\n%d\n", len(cert))
	id.Write(cert)
	id.Write(key)
	return tls.X509KeyPair(cert, key)
}

// hostKey identifies an upstream entry by what it matches.
type hostKey struct {
	host string
	port int
}

func (k hostKey) String() string {
	if k.port == 0 {
		return k.host
	}
	return net.JoinHostPort(k.host, strconv.Itoa(k.port))
}

// build resolves docs (the base file first, then overrides) over the
// embedded defaults into a Policy. parents[j], for an overlay, is the
// Policy of docs[:j+1]; each doc after the first is a per-pod override, and
// an entry it adds refines the entry of its parent that matches the entry's
// host and port, so it keeps the node's budget name, budget, bulkhead, body
// limits, TLS and credential for that destination.
func build(source string, docs []*rawDoc, parents []*Policy) (*Policy, error) {
	r := &resolver{seen: map[string]bool{}}
	p := &Policy{
		Source:  source,
		docs:    docs,
		parents: parents,
		exact:   map[string]map[int]*Upstream{},
		wild:    map[string]map[int]*Upstream{},
	}

	// Ranks: defaults layers first (in file order), then entry layers.
	def := builtin()
	defOrigins := origins{}
	for i, d := range docs {
		if d.defaults != nil {
			apply(&def, d.defaults, defOrigins, i)
		}
	}
	r.entry = pos{file: source}
	r.check(&def, defOrigins)
	r.finish(&def, defOrigins, "defaults")
	def.origins = layerOrigins(defOrigins, len(docs))
	p.Defaults = &def
	def.dests = newDestCache()

	// Group entries by what they match, keeping first-seen order.
	type group struct {
		key    hostKey
		layers []*rawUpstream
		ranks  []int
	}
	var groups []*group
	byKey := map[hostKey]*group{}
	for i, d := range docs {
		first := map[hostKey]*rawUpstream{}
		for _, e := range d.upstreams {
			k := hostKey{e.Host.v, e.Port.v}
			if prev, dup := first[k]; dup {
				r.errAt(e.Host.at, ErrDuplicate, "%s is already matched by %s (line %d)", k, prev.at.path, prev.at.line)
				continue
			}
			first[k] = e
			g := byKey[k]
			if g == nil {
				g = &group{key: k}
				if i > 0 {
					base := parents[i-1]
					if k.port == 0 || k.host[0] == '*' {
						r.errAt(e.Host.at, ErrNotOverridable,
							"a pod may add entries for an exact host and port only (the node's policy decides wildcards and port-less entries)")
						continue
					}
					if bu := base.Match(k.host, k.port); bu.Host != "" {
						bg := byKey[hostKey{bu.Host, bu.Port}]
						g.layers = append(g.layers, bg.layers...)
						g.ranks = append(g.ranks, bg.ranks...)
					}
				}
				byKey[k] = g
				groups = append(groups, g)
			}
			g.layers = append(g.layers, e)
			g.ranks = append(g.ranks, len(docs)+i)
		}
	}

	names := map[string]*Upstream{}
	nameAt := map[string]pos{}
	for _, g := range groups {
		u := def
		u.refresher, u.refresh, u.tlsConfig, u.tlsID, u.dests = nil, nil, nil, "", nil
		o := make(origins, len(defOrigins)+8)
		for k, v := range defOrigins {
			o[k] = v
		}
		for i, l := range g.layers {
			apply(&u, l, o, g.ranks[i])
		}
		last := g.layers[len(g.layers)-1]
		r.entry = last.at
		u.Host, u.Port = g.key.host, g.key.port
		if _, explicit := o["name"]; explicit {
			u.named = true
		} else if u.Port != 0 && u.Host[0] != '*' {
			u.Name, u.named = g.key.String(), true
		}
		r.check(&u, o)
		r.finish(&u, o, last.at.path+" ("+g.key.String()+")")
		u.origins = layerOrigins(o, len(docs))
		if _, explicit := o["name"]; !explicit && u.named {
			from := FromEntry
			if g.ranks[len(g.ranks)-1] > len(docs) {
				from = FromPodEntry
			}
			u.origins["name"] = fieldOrigin{from, last.at}
		}
		if u.named {
			if prev, ok := names[u.Name]; ok && prev.Budget != u.Budget {
				r.errAt(nameOrHost(o, last), ErrConflict,
					"shares the budget name %q with %s but not its budget settings", u.Name, nameAt[u.Name].path)
			} else if !ok {
				names[u.Name] = &u
				nameAt[u.Name] = last.at
			}
		}
		if !u.named {
			u.dests = newDestCache()
		}
		p.Upstreams = append(p.Upstreams, &u)
		index := p.exact
		host := u.Host
		if h, ok := cutWildcard(host); ok {
			index, host = p.wild, h
		}
		if index[host] == nil {
			index[host] = map[int]*Upstream{}
		}
		index[host][u.Port] = &u
	}
	if len(r.errs) > 0 {
		sortErrors(r.errs)
		if len(r.errs) > maxErrors {
			r.errs = r.errs[:maxErrors]
		}
		return nil, r.errs
	}
	p.Warnings = r.warnings
	p.files = r.files
	p.DenyDestinations = DefaultDenyDestinations()
	for _, d := range docs {
		if d.deny.set {
			p.DenyDestinations = d.deny.v
		}
	}
	return p, nil
}

// sortErrors puts the problems of each file in file order (files keep the
// order of their first problem).
func sortErrors(es Errors) {
	slices.SortStableFunc(es, func(a, b *Error) int {
		if a.File != b.File {
			return 0
		}
		if a.Line != b.Line {
			return a.Line - b.Line
		}
		return a.Column - b.Column
	})
}

func nameOrHost(o origins, e *rawUpstream) pos {
	if g, ok := o["name"]; ok {
		return g.at
	}
	return e.Host.at
}

// cutWildcard turns "*.example.com" into ".example.com".
func cutWildcard(h string) (string, bool) {
	if len(h) > 2 && h[0] == '*' && h[1] == '.' {
		return h[1:], true
	}
	return h, false
}

// refreshTimeoutOrDefault is used by the refresher when none was resolved.
func refreshTimeoutOrDefault(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultRefreshTimeout
	}
	return d
}
