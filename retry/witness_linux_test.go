//go:build linux

package retry

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/client"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
	"github.com/egret-proxy/egret/witness"
)

// TestWitnessDiscardsQueuedRequestBytes: the upstream stops reading (zero
// window) and the attempt times out with request bytes still queued in the
// socket. Freezing the connection must record them and close with RST so
// that they never leave later; the evidence stays sent_no_response (some
// bytes did leave), so the POST is ambiguous.
func TestWitnessDiscardsQueuedRequestBytes(t *testing.T) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	readErr := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			readErr <- err
			return
		}
		defer c.Close()
		time.Sleep(500 * time.Millisecond) // not synchronisation: a server not reading, so that the window closes
		_, err = io.Copy(io.Discard, c)
		readErr <- err
	}()
	base := client.NewHTTPTransport(client.HTTPOptions{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			c.(*net.TCPConn).SetWriteBuffer(4 << 20)
		}
		return c, err
	}})
	t.Cleanup(base.CloseIdleConnections)
	tr, _, _ := testTransport(t, func(p *Policy) { p.AttemptTimeout = 200 * time.Millisecond })
	tr.Base = base
	tr.Witness = witness.TCPInfo{}
	req := rawtest.Post(t, "http://"+ln.Addr().String()+"/", strings.Repeat("q", 256<<10))
	_, err = tr.RoundTrip(req)
	var a *AmbiguousError
	if !errors.As(err, &a) {
		t.Fatalf("err %v", err)
	}
	at := a.Trace.Attempts[0]
	after := at.WitnessAfter
	if at.Failure != engine.ResponseTimeout || at.Upgraded || !after.HasNotSentBytes || after.NotSentBytes == 0 || !after.QueueDiscarded {
		t.Fatalf("attempt %+v", at)
	}
	if err := <-readErr; !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("upstream read ended with %v, want a reset (queue discarded)", err)
	}
}
