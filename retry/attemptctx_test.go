package retry

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

// The attempt's bounds over real connections: the per-attempt timeout
// bounds the wait for the head only, the overall deadline the body too, and
// the caller's context both.

// slowBodyServer answers with a head at once and its body in pieces, gap
// apart.
func slowBodyServer(t *testing.T, pieces int, gap time.Duration) *rawtest.Server {
	return rawtest.NewServer(t, func(c net.Conn, n int) {
		br := bufio.NewReader(c)
		if _, _, err := rawtest.ReadReq(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(pieces)+"\r\n\r\n")
		for range pieces {
			time.Sleep(gap) // not synchronisation: the slow body under test
			if _, err := io.WriteString(c, "x"); err != nil {
				return
			}
		}
		io.Copy(io.Discard, br)
	})
}

func TestAttemptTimeoutDoesNotCutTheBody(t *testing.T) {
	// The body takes 3 × 400 ms, well past the 300 ms attempt timeout: the
	// head came in time, so the body is read whole.
	srv := slowBodyServer(t, 3, 400*time.Millisecond)
	tr, _, _ := testTransport(t, func(p *Policy) {
		p.AttemptTimeout = 300 * time.Millisecond
		p.Timeout = 5 * time.Second
	})
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "xxx" {
		t.Fatalf("body %q, %v", b, err)
	}
}

func TestDeadlineEndsASlowBody(t *testing.T) {
	// The overall deadline (300 ms) passes while the body trickles in.
	srv := slowBodyServer(t, 9, 100*time.Millisecond)
	tr, _, _ := testTransport(t, func(p *Policy) {
		p.AttemptTimeout = 100 * time.Millisecond
		p.Timeout = 300 * time.Millisecond
	})
	start := time.Now()
	resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("body %q, err %v: want the deadline's", b, err)
	}
	if took < 250*time.Millisecond || took > 2*time.Second {
		t.Fatalf("the body ended after %v, want about 300 ms", took)
	}
}

func TestCallerCancelEndsTheWaitForTheHead(t *testing.T) {
	var executed atomic.Int64
	srv := slowServer(t, &executed)
	tr, _, _ := testTransport(t, func(p *Policy) {
		p.AttemptTimeout = 5 * time.Second
		p.Timeout = 10 * time.Second
	})
	ctx, cancel := context.WithCancelCause(context.Background())
	why := errors.New("the client left")
	time.AfterFunc(100*time.Millisecond, func() { cancel(why) })
	start := time.Now()
	_, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "charge").WithContext(ctx))
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("RoundTrip returned after %v", took)
	}
	var a *AmbiguousError
	if !errors.As(err, &a) || !errors.Is(err, why) || a.Attempts != 1 {
		t.Fatalf("err %v, want ambiguous with the caller's cause after 1 attempt", err)
	}
}
