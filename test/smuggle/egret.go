package smuggle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
)

// EgretPolicy is the policy the suite runs egret with: its defaults, with
// short timeouts so that a request the upstream cannot frame ends soon.
const EgretPolicy = `defaults:
  timeout: 3s
  attempt_timeout: 2s
`

// Egret runs cases through a real egret proxy.Server, in process, one
// server per case (its Shutdown is the event that says every log line of
// the case was written); the budgets, bulkheads and traces are shared.
type Egret struct {
	Mode    Mode
	pol     proxy.PolicySource
	budgets *engine.Budgets
	bulk    *proxy.Bulkheads
	traces  *proxy.Traces
}

// NewEgret makes a runner for mode.
func NewEgret(mode Mode) (*Egret, error) {
	dir, err := os.MkdirTemp("", "egret-smuggle")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	p, err := policy.Parse(dir+"/policy.yaml", []byte(EgretPolicy))
	if err != nil {
		return nil, err
	}
	return &Egret{Mode: mode, pol: proxy.StaticPolicy{P: p}, budgets: engine.NewBudgets(),
		bulk: proxy.NewBulkheads(), traces: proxy.NewTraces(64)}, nil
}

// logSink keeps egret's request log lines.
type logSink struct {
	mu    sync.Mutex
	lines []Logged
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *logSink) WithGroup(string) slog.Handler            { return s }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "request" {
		return nil
	}
	var l Logged
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "id":
			l.ID = a.Value.String()
		case "method":
			l.Method = a.Value.String()
		case "url":
			l.URL = a.Value.String()
		case "attempts":
			l.Attempts = int(a.Value.Int64())
		case "outcome":
			l.Outcome = a.Value.String()
		case "status":
			l.Status = int(a.Value.Int64())
		case "err":
			l.Err = a.Value.String()
		}
		return true
	})
	s.mu.Lock()
	s.lines = append(s.lines, l)
	s.mu.Unlock()
	return nil
}

// learner records that egret passed a connection through unparsed.
type learner struct {
	mu   sync.Mutex
	seen bool
}

func (l *learner) LearnDirect(netip.AddrPort, proxy.Protocol) error {
	l.mu.Lock()
	l.seen = true
	l.mu.Unlock()
	return nil
}

// Result is one case run.
type Result struct {
	Case    *Case
	Mode    Mode
	Verdict Verdict
	Logs    []Logged
	// Answer is what the client read back (for the report).
	Answer []byte
	// Stalled: the proxy neither answered nor closed in time.
	Stalled bool
}

// ClientDeadline bounds one case's connection.
const ClientDeadline = 15 * time.Second

// Run sends c (and the innocent request) through a fresh egret to a fresh
// strict upstream and judges what the upstream read against egret's log.
func (e *Egret) Run(c *Case) (*Result, error) {
	up, err := StartUpstream()
	if err != nil {
		return nil, err
	}
	dst, err := netip.ParseAddrPort(up.Addr())
	if err != nil {
		return nil, err
	}
	sink, learn := &logSink{}, &learner{}
	cfg := proxy.Config{
		Mode:   proxy.Explicit,
		Policy: e.pol,
		Shared: proxy.Shared{Budgets: e.budgets, Bulkheads: e.bulk, LogQuery: true, Via: "egret"},
		Traces: e.traces,
		Logger: slog.New(sink),
	}
	if e.Mode == Transparent {
		cfg.Mode, cfg.Resolver, cfg.Learner, cfg.Via = proxy.Transparent, &proxy.StaticResolver{Dst: dst}, learn, ""
	}
	srv, err := proxy.New(cfg)
	if err != nil {
		up.Finish()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		up.Finish()
		return nil, err
	}
	served := make(chan struct{})
	go func() { srv.Serve(ln); close(served) }()

	raw, err := c.Expand(e.Mode, up.Addr())
	if err != nil {
		up.Finish()
		return nil, err
	}
	answer, stalled, cerr := exchange(ln.Addr().String(), raw)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	serr := srv.Shutdown(ctx)
	cancel()
	<-served
	conns := up.Finish()
	if cerr != nil {
		return nil, cerr
	}
	if serr != nil {
		return nil, fmt.Errorf("case %s: egret shutdown: %w", c.ID, serr)
	}
	sink.mu.Lock()
	logs := sink.lines
	sink.mu.Unlock()
	learn.mu.Lock()
	passed := learn.seen
	learn.mu.Unlock()
	r := &Result{Case: c, Mode: e.Mode, Logs: logs, Answer: answer, Stalled: stalled}
	r.Verdict = Judge(raw, logs, conns, passed)
	return r, nil
}

// exchange writes raw on a new connection to addr, half-closes it and
// reads until the proxy closes (or ClientDeadline).
func exchange(addr string, raw []byte) (answer []byte, stalled bool, err error) {
	return Exchange(nil, addr, raw)
}

// Exchange is exchange from the local address from (nil: any).
func Exchange(from *net.TCPAddr, addr string, raw []byte) (answer []byte, stalled bool, err error) {
	d := net.Dialer{}
	if from != nil {
		d.LocalAddr = from
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, false, err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(ClientDeadline))
	// A proxy may refuse and close before it read everything: the write
	// may then fail, and what it wrote is what counts.
	nc.Write(raw)
	nc.(*net.TCPConn).CloseWrite()
	answer, rerr := io.ReadAll(nc)
	if rerr != nil && errors.Is(rerr, os.ErrDeadlineExceeded) {
		stalled = true
	}
	return answer, stalled, nil
}
