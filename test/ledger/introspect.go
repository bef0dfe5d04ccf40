package ledger

import (
	"encoding/json"
	"net/http"
	"strings"
)

// IntrospectPrefix is the path under which a server with Introspect set
// answers questions about itself instead of recording a request:
//
//	GET /_ledger/records/<id>  the Record of id, as JSON
//	GET /_ledger/stats         the Stats, as JSON
//
// For a ledger in another process (a demo, or a test in another network
// namespace); in-process tests call Record and Stats.
const IntrospectPrefix = "/_ledger/"

// introspect answers an introspection path.
func (s *Server) introspect(path string) answer {
	var v any
	switch rest := strings.TrimPrefix(path, IntrospectPrefix); {
	case strings.HasPrefix(rest, "records/"):
		v = s.Record(strings.TrimPrefix(rest, "records/"))
	case rest == "stats":
		v = s.Stats()
	default:
		return plainAnswer(http.StatusNotFound, "ledger: unknown introspection path\n")
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return plainAnswer(http.StatusInternalServerError, err.Error()+"\n")
	}
	a := answer{status: http.StatusOK, header: make(http.Header), body: append(b, '\n')}
	a.header.Set("Content-Type", "application/json")
	return a
}
