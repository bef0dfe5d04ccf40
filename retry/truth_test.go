package retry

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
	"github.com/egret-proxy/egret/witness"
)

// ledger counts executions by request id.
type ledger struct {
	mu   sync.Mutex
	runs map[string]int
}

func (l *ledger) run(id string) {
	l.mu.Lock()
	l.runs[id]++
	l.mu.Unlock()
}

func (l *ledger) count(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs[id]
}

// faultyLedgerServer executes requests (by X-Id) and fails in the ways of
// the spec: every fifth connection is reset before anything is read (not
// executed); of the requests read, some are reset after reading (executed,
// no answer), some answered after the attempt timeout (executed), some
// answered 503 (executed), the rest 200.
func faultyLedgerServer(t *testing.T, l *ledger) *rawtest.Server {
	var k atomic.Int64
	return rawtest.NewServer(t, func(c net.Conn, n int) {
		if n%5 == 0 {
			rawtest.Reset(c)
			return
		}
		br := bufio.NewReader(c)
		for {
			req, _, err := rawtest.ReadReq(br)
			if err != nil {
				return
			}
			l.run(req.Header.Get("X-Id"))
			switch i := k.Add(1); {
			case i%11 == 0:
				rawtest.Reset(c)
				return
			case i%13 == 0:
				time.Sleep(120 * time.Millisecond) // not synchronisation: a late answer, one of the faults
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
			case i%4 == 0:
				io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
			default:
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		}
	})
}

// TestTruthUnderFaults drives mixed requests through one Transport (with
// the TCP_INFO witness) against the faulty ledger server and checks the
// spec's promises against what the server really executed: exactly one
// answer per request, no non-idempotent request executed twice, never
// not-sent for an executed request, ambiguity only for non-idempotent ones.
func TestTruthUnderFaults(t *testing.T) {
	l := &ledger{runs: map[string]int{}}
	srv := faultyLedgerServer(t, l)
	tr, _, _ := testTransport(t, func(p *Policy) { p.AttemptTimeout = 50 * time.Millisecond })
	tr.Witness = witness.TCPInfo{}
	var upgraded, attempts atomic.Int64
	tr.OnTrace = func(tc *Trace) {
		for _, a := range tc.Attempts {
			attempts.Add(1)
			if a.Upgraded {
				upgraded.Add(1)
			}
		}
	}
	methods := []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodPatch, http.MethodDelete}
	type answer struct {
		id, method, kind string
	}
	var mu sync.Mutex
	var answers []answer
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 80 {
				m := methods[(g+i)%len(methods)]
				id := fmt.Sprintf("%d-%d", g, i)
				var body io.Reader
				if m != http.MethodGet && m != http.MethodDelete {
					body = strings.NewReader("payload " + id)
				}
				req, _ := http.NewRequest(m, srv.URL(), body)
				req.Header.Set("X-Id", id)
				resp, err := tr.RoundTrip(req)
				kind := ""
				var a *AmbiguousError
				var e *Error
				switch {
				case err == nil:
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					kind = fmt.Sprint(resp.StatusCode)
					if resp.Header.Get(HeaderOutcome) != "" {
						kind += " " + resp.Header.Get(HeaderOutcome)
					}
				case errors.As(err, &a):
					kind = "ambiguous"
				case errors.As(err, &e):
					kind = e.Outcome.String()
				default:
					kind = "untyped: " + err.Error()
				}
				mu.Lock()
				answers = append(answers, answer{id, m, kind})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(answers) != 8*80 {
		t.Fatalf("%d answers for %d requests", len(answers), 8*80)
	}
	table := map[string]int{}
	for _, a := range answers {
		runs := l.count(a.id)
		idem := engine.MethodIdempotent(a.method)
		table[a.method+" "+a.kind]++
		switch {
		case strings.HasPrefix(a.kind, "untyped"):
			t.Errorf("%s %s: %s", a.method, a.id, a.kind)
		case !idem && runs > 1:
			t.Errorf("%s %s executed %d times", a.method, a.id, runs)
		case a.kind == "not-sent" && runs != 0:
			t.Errorf("%s %s answered not-sent but executed %d times", a.method, a.id, runs)
		case strings.HasPrefix(a.kind, "200") && runs == 0:
			t.Errorf("%s %s answered 200 but never executed", a.method, a.id)
		case strings.Contains(a.kind, "ambiguous") && idem:
			t.Errorf("%s %s (idempotent) answered %s", a.method, a.id, a.kind)
		}
	}
	keys := make([]string, 0, len(table))
	for k := range table {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %-28s %4d", k, table[k])
	}
	t.Logf("%d requests, %d attempts, %d upgraded by the witness; answers by method and outcome:%s",
		len(answers), attempts.Load(), upgraded.Load(), b.String())
}
