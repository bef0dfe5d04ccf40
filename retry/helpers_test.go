package retry

import (
	"bufio"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/client"
)

// rawServer is a loopback TCP server whose connections are handled by fn
// (conn number from 1).
type rawServer struct {
	ln    net.Listener
	conns atomic.Int64
	wg    sync.WaitGroup
	mu    sync.Mutex
	open  []net.Conn
}

func newRawServer(t *testing.T, fn func(c net.Conn, n int)) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(s.conns.Add(1))
			s.mu.Lock()
			s.open = append(s.open, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				fn(c, n)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.open {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *rawServer) url() string { return "http://" + s.ln.Addr().String() + "/" }

// readReq reads one whole request (body included) from br.
func readReq(br *bufio.Reader) (*http.Request, []byte, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, err
	}
	b, err := io.ReadAll(req.Body)
	return req, b, err
}

// reset closes c with RST.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// sleeps records the waits of a Transport instead of sleeping.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) all() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// lockedRand makes a seeded generator safe for the Transport.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) Int64N(n int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Int64N(n)
}

// testTransport returns a Transport with recorded waits, a seeded jitter,
// a fresh pool and the given policy changes.
func testTransport(t *testing.T, edit func(*Policy)) (*Transport, *sleeps, *[]*Trace) {
	t.Helper()
	base := client.NewHTTPTransport(client.HTTPOptions{})
	t.Cleanup(base.CloseIdleConnections)
	s := &sleeps{}
	var mu sync.Mutex
	traces := &[]*Trace{}
	tr := &Transport{
		Base: base,
		Policy: func(r *http.Request) Policy {
			p := DefaultPolicy("")
			p.Backoff = engine.Backoff{Kind: engine.FullJitter, Base: time.Millisecond, Max: 2 * time.Second}
			if edit != nil {
				edit(&p)
			}
			return p
		},
		Rand:  &lockedRand{r: rand.New(rand.NewPCG(1, 2))},
		Sleep: s.sleep,
		OnTrace: func(tc *Trace) {
			mu.Lock()
			*traces = append(*traces, tc)
			mu.Unlock()
		},
	}
	return tr, s, traces
}
