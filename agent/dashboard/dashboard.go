// Package dashboard is the node page: what egret does on this node, by
// pod and by upstream, live, in a browser, served on the agent's (or
// `egret proxy`'s) metrics address beside /metrics.
//
//	GET /                  the page: per-pod and per-upstream tables, rates, budgets, recent ambiguous and not-sent requests
//	GET /explain/{id}      the page of one request's explanation
//	GET /api/summary       agent.Summary, which the page polls every second
//	GET /api/explain/{id}  agent.TraceView, less the URL's query and user information
//	GET /assets/...        the page's script and style (embedded)
//
// Everything is embedded (the page works offline and loads nothing from
// elsewhere); a strict Content-Security-Policy allows only the page's own
// script, style and API. The script builds the DOM with textContent:
// no data is ever parsed as HTML.
package dashboard

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/url"
	"regexp"
	"time"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/retry"
)

//go:embed assets
var assets embed.FS

// CSP is the Content-Security-Policy of every answer.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Tracer finds a recent request's trace and its pod (agent.AdminSource's
// Trace).
type Tracer interface {
	Trace(id string) (retry.Trace, string, bool)
}

// requestID is the form of an Egret-Request-Id.
var requestID = regexp.MustCompile(`^[0-9a-f]{16}$`)

// Handler serves the page of sum's summaries and tr's explanations.
func Handler(sum *agent.Summarizer, tr Tracer) http.Handler {
	static, _ := fs.Sub(assets, "assets")
	page := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			b, err := fs.ReadFile(static, name)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			w.Write(b)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", page("index.html"))
	mux.HandleFunc("GET /explain/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !requestID.MatchString(r.PathValue("id")) {
			http.NotFound(w, r)
			return
		}
		page("explain.html")(w, r)
	})
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(static)))
	mux.HandleFunc("GET /api/summary", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, sum.Summary(time.Now()))
	})
	mux.HandleFunc("GET /api/explain/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !requestID.MatchString(id) {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "not a request id: expected 16 hex digits"})
			return
		}
		t, pod, ok := tr.Trace(id)
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no trace for request " + id + " (it may have been pushed out by newer ones)"})
			return
		}
		v := agent.ViewTrace(t)
		v.Pod = pod
		writeJSON(w, http.StatusOK, Redact(v))
	})
	return headers(mux)
}

// headers sets the security headers of every answer.
func headers(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", CSP)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("X-Frame-Options", "DENY")
		h.ServeHTTP(w, r)
	})
}

// urlInText finds the query and fragment of the URLs quoted in error
// text (net/http writes `Get "http://host/path?q": ...`).
var (
	urlInText  = regexp.MustCompile(`(https?://[^\s"'?#]*)[?#][^\s"']*`)
	userInText = regexp.MustCompile(`(https?://)[^/\s"'@]*@`)
)

// Redact is v as the page shows it: the URL without user information,
// query or fragment (whatever --log-query says: the metrics address may
// be reachable by more people than the admin socket), and the same for
// URLs inside error text.
func Redact(v agent.TraceView) agent.TraceView {
	if u, err := url.Parse(v.URL); err == nil {
		u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
		v.URL = u.String()
	} else {
		v.URL = ""
	}
	at := make([]agent.AttemptView, len(v.Attempts))
	for i, a := range v.Attempts {
		a.Err = urlInText.ReplaceAllString(userInText.ReplaceAllString(a.Err, "$1"), "$1")
		at[i] = a
	}
	v.Attempts = at
	return v
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
