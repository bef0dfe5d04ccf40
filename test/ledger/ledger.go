// Package ledger is a real upstream HTTP server for egret's tests: it records
// every request it executes, keyed by an ID the client sets, honours
// Idempotency-Key as a real server would, and carries a fault layer that can,
// per request, break the exchange at a chosen point.
//
// A request names itself with the Ledger-Id header and asks for a fault with
// Ledger-Fault (see Kind and ParseFault). The server listens on loopback with
// HTTP/1.1 and HTTP/2 with prior knowledge on the same port (the HTTP/2
// preface is sniffed), and with TLS (ALPN h2 or http/1.1) under a test CA
// generated at start. HTTP/1.1 is served by a loop of its own on the raw TCP
// connection and HTTP/2 by a frame loop of its own, so that a fault can reset
// the connection (SO_LINGER 0 then close: a TCP RST) or a stream at any byte.
//
// Executed means the server read the whole request and did the work: the
// execution is in the ledger before any byte of the answer is written. A key
// replay (a repeated Idempotency-Key answered from the store) is not an
// execution. Which faults execute is Kind.Executes.
//
// A normal answer is 200 with a text body of Ledger-Response-Size bytes
// (default 256) and the headers Ledger-Executions (executions of this id so
// far), Ledger-Body-Sha256 and Ledger-Body-Size (of the request body as the
// server received it), and Ledger-Replayed: 1 for a key replay.
package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"
)

// Header names the ledger reads and writes.
const (
	HeaderID           = "Ledger-Id"
	HeaderFault        = "Ledger-Fault"
	HeaderResponseSize = "Ledger-Response-Size"
	HeaderExecutions   = "Ledger-Executions"
	HeaderBodySHA256   = "Ledger-Body-Sha256"
	HeaderBodySize     = "Ledger-Body-Size"
	HeaderReplayed     = "Ledger-Replayed"
	HeaderExecuted     = "Ledger-Executed"
	HeaderIdemKey      = "Idempotency-Key"
)

// MaxResponseSize bounds Ledger-Response-Size.
const MaxResponseSize = 1 << 20

// Execution is one execution of a request.
type Execution struct {
	Method     string
	Path       string
	Proto      string // "HTTP/1.1" or "HTTP/2.0"
	BodySize   int64
	BodySHA256 string // hex
	Key        string // Idempotency-Key, if any
	At         time.Time
}

// Record is what the ledger knows of one Ledger-Id.
type Record struct {
	ID string
	// Arrivals counts the request heads that reached the server, faulted
	// or not (attempts that got that far).
	Arrivals int
	// Executions lists the real executions, in order.
	Executions []Execution
	// Replays counts answers given from the Idempotency-Key store.
	Replays int
	// Faulted counts arrivals a fault applied to; Victims counts arrivals
	// reset by a previous request's reset-on-reuse fault.
	Faulted int
	Victims int
	// Collateral counts HTTP/2 streams of this id that were in flight, or
	// answered (or refused) less than a second before, on a connection
	// another request's reset-on-reuse reset (the reset can destroy frames
	// the client has not read yet); Bystander counts
	// HTTP/2 heads of this id refused (not processed, not an arrival)
	// because another request's goaway or close-idle had sent GOAWAY.
	Collateral int
	Bystander  int
	// Faults counts the faults applied, by kind.
	Faults map[Kind]int
}

// Stats are server-wide counters.
type Stats struct {
	Connections    int // accepted TCP connections
	Arrivals       int
	Executions     int
	Replays        int
	KeyConflicts   int // 409 (key in use) and 422 (key reused with another body)
	IdleCloses     int // connections closed by close-idle
	ReuseResets    int // connections reset by reset-on-reuse
	Collateral     int // HTTP/2 streams cut by those resets
	H2Streams      int
	BadFaultHeader int
	Faults         map[Kind]int
}

type keyEntry struct {
	done   bool
	sum    string
	answer answer
}

// Server is the ledger upstream. Its methods are safe for concurrent use.
type Server struct {
	mu      sync.Mutex
	records map[string]*Record
	keys    map[string]*keyEntry
	stats   Stats
	// changed is closed (and dropped) at each change of the records or
	// the stats: Await's event.
	changed chan struct{}

	lnMu   sync.Mutex
	lns    []net.Listener
	conns  map[net.Conn]struct{}
	closed chan struct{}
	wg     sync.WaitGroup

	caOnce sync.Once
	ca     *testCA
	caErr  error

	// IdleTimeout closes a connection idle that long (default 60 s).
	IdleTimeout time.Duration
	// Introspect serves IntrospectPrefix (set before listening).
	Introspect bool

	// frameDecided, when set (tests), runs on HTTP/2 between a stream's
	// end being decided (RST_STREAM, GOAWAY) and its frame being written.
	frameDecided func(*h2conn)
}

// New returns a server with no listener yet.
func New() *Server {
	return &Server{
		records: make(map[string]*Record),
		keys:    make(map[string]*keyEntry),
		conns:   make(map[net.Conn]struct{}),
		closed:  make(chan struct{}),
		stats:   Stats{Faults: make(map[Kind]int)},
	}
}

// Await waits until cond reports true, or timeout has passed, and says
// whether cond held. cond looks at the server (Record, Executions,
// Stats...): it is called at the start and again after each change of
// the records or the stats, not in a timed loop, so that a test waits for
// an arrival or an execution on the event itself.
func (s *Server) Await(timeout time.Duration, cond func() bool) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		ch := s.changed
		s.mu.Unlock()
		// ch is taken before cond looks: a change while it looks closes
		// ch, and cond is asked again.
		if cond() {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			return cond()
		}
	}
}

// notifyLocked tells Await's waiters of a change (s.mu held).
func (s *Server) notifyLocked() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// Record returns a copy of the record of id (zero Record if unseen).
func (s *Server) Record(id string) Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.records[id]
	if !ok {
		return Record{ID: id}
	}
	return copyRecord(r)
}

// Executions returns how many times the request id was executed.
func (s *Server) Executions(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.records[id]; ok {
		return len(r.Executions)
	}
	return 0
}

// Records returns a copy of every record.
func (s *Server) Records() map[string]Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Record, len(s.records))
	for id, r := range s.records {
		out[id] = copyRecord(r)
	}
	return out
}

// Stats returns a copy of the server-wide counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Faults = make(map[Kind]int, len(s.stats.Faults))
	for k, v := range s.stats.Faults {
		st.Faults[k] = v
	}
	return st
}

func copyRecord(r *Record) Record {
	c := *r
	c.Executions = append([]Execution(nil), r.Executions...)
	c.Faults = make(map[Kind]int, len(r.Faults))
	for k, v := range r.Faults {
		c.Faults[k] = v
	}
	return c
}

func (s *Server) recordLocked(id string) *Record {
	r, ok := s.records[id]
	if !ok {
		r = &Record{ID: id, Faults: make(map[Kind]int)}
		s.records[id] = r
	}
	return r
}

// head is a request head as the fault layer sees it.
type head struct {
	id, method, path, proto, key string
	fault                        Fault
	faultErr                     error
	respSize                     int
}

func newHead(h http.Header, method, path, proto string) *head {
	hd := &head{
		id:       h.Get(HeaderID),
		method:   method,
		path:     path,
		proto:    proto,
		key:      h.Get(HeaderIdemKey),
		respSize: 256,
	}
	hd.fault, hd.faultErr = ParseFault(h.Get(HeaderFault))
	if v := h.Get(HeaderResponseSize); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 && n <= MaxResponseSize {
			hd.respSize = n
		}
	}
	return hd
}

// arrive counts the arrival of a head and returns the fault to apply to it
// (KindNone when times is used up).
func (s *Server) arrive(h *head) Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notifyLocked()
	s.stats.Arrivals++
	r := s.recordLocked(h.id)
	r.Arrivals++
	if h.faultErr != nil {
		s.stats.BadFaultHeader++
		return Fault{Kind: KindNone}
	}
	f := h.fault
	if f.Kind == KindNone || (f.Times > 0 && r.Arrivals > f.Times) {
		return Fault{Kind: KindNone, RetryAfter: -1}
	}
	r.Faulted++
	r.Faults[f.Kind]++
	s.stats.Faults[f.Kind]++
	return f
}

// victim counts an arrival reset by a previous request's reset-on-reuse.
func (s *Server) victim(h *head) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notifyLocked()
	s.stats.Arrivals++
	s.stats.ReuseResets++
	r := s.recordLocked(h.id)
	r.Arrivals++
	r.Victims++
}

// collateral counts streams in flight on a connection that is being reset
// because of another request.
func (s *Server) collateral(ids []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notifyLocked()
	for _, id := range ids {
		s.stats.Collateral++
		s.recordLocked(id).Collateral++
	}
}

// bystander counts a head refused by a GOAWAY another request caused.
func (s *Server) bystander(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notifyLocked()
	s.recordLocked(id).Bystander++
}

func (s *Server) countIdleClose() {
	s.mu.Lock()
	s.notifyLocked()
	s.stats.IdleCloses++
	s.mu.Unlock()
}

// answer is a complete HTTP answer.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// execute runs the request whose whole body has been read: it executes it
// (or replays a stored key answer) and returns the normal answer.
func (s *Server) execute(h *head, size int64, sum [32]byte) answer {
	hexSum := hex.EncodeToString(sum[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notifyLocked()
	var ke *keyEntry
	if h.key != "" {
		if e, ok := s.keys[h.key]; ok {
			switch {
			case !e.done:
				s.stats.KeyConflicts++
				return plainAnswer(http.StatusConflict, "idempotency key in use\n")
			case e.sum != hexSum:
				s.stats.KeyConflicts++
				return plainAnswer(http.StatusUnprocessableEntity, "idempotency key reused with another body\n")
			}
			s.stats.Replays++
			s.recordLocked(h.id).Replays++
			a := e.answer.clone()
			a.header.Set(HeaderReplayed, "1")
			return a
		}
		ke = &keyEntry{sum: hexSum}
		s.keys[h.key] = ke
	}
	r := s.recordLocked(h.id)
	r.Executions = append(r.Executions, Execution{
		Method: h.method, Path: h.path, Proto: h.proto,
		BodySize: size, BodySHA256: hexSum, Key: h.key, At: time.Now(),
	})
	s.stats.Executions++
	n := len(r.Executions)
	a := answer{status: http.StatusOK, header: make(http.Header)}
	a.header.Set("Content-Type", "text/plain; charset=utf-8")
	a.header.Set(HeaderExecutions, strconv.Itoa(n))
	a.header.Set(HeaderBodySHA256, hexSum)
	a.header.Set(HeaderBodySize, strconv.FormatInt(size, 10))
	a.body = responseBody(h, n, size, hexSum)
	if ke != nil {
		ke.done = true
		ke.answer = a.clone()
	}
	return a
}

// ResponseBody returns the deterministic body the ledger answers for an
// execution; clients can compare a received body's length and prefix.
func responseBody(h *head, n int, size int64, sum string) []byte {
	line := fmt.Sprintf("ledger id=%s method=%s execution=%d size=%d sha256=%s\n", h.id, h.method, n, size, sum)
	b := make([]byte, h.respSize)
	k := copy(b, line)
	for i := k; i < len(b); i++ {
		b[i] = "abcdefghijklmnopqrstuvwxyz0123456789\n"[i%37]
	}
	return b
}

func (a answer) clone() answer {
	return answer{status: a.status, header: a.header.Clone(), body: a.body}
}

func plainAnswer(status int, text string) answer {
	a := answer{status: status, header: make(http.Header), body: []byte(text)}
	a.header.Set("Content-Type", "text/plain; charset=utf-8")
	return a
}

// faultAnswer is what a status fault answers; executed says the work was
// done before it.
func faultAnswer(f Fault, executed bool) answer {
	st := f.Kind.Status()
	a := plainAnswer(st, fmt.Sprintf("ledger fault %d\n", st))
	if f.Kind == KindStatus429 && f.RetryAfter >= 0 {
		a.header.Set("Retry-After", strconv.Itoa(f.RetryAfter))
	}
	if executed {
		a.header.Set(HeaderExecuted, "1")
	}
	return a
}

// sortedKeys returns the header names in a stable order.
func sortedKeys(h http.Header) []string {
	ks := make([]string, 0, len(h))
	for k := range h {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// sleep waits d or until the server closes; it reports whether d elapsed.
func (s *Server) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.closed:
		return false
	}
}

func hashOf(b []byte) [32]byte { return sha256.Sum256(b) }
