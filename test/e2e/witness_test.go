package e2e

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/proxy"
)

// resetFirst listens on ip and resets the first connection once the
// client's dial has returned (dialed is closed then; SO_LINGER 0 then close:
// a RST before the client wrote anything); later connections are relayed to
// next. A RST that lands while the dialer still waits for the connect's
// result fails the dial itself (ECONNRESET), which is not_sent without any
// witness and not the case this test is about.
func resetFirst(t *testing.T, ip netip.Addr, next netip.AddrPort, dialed <-chan struct{}) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if n.Add(1) == 1 {
				select {
				case <-dialed:
				case <-time.After(10 * time.Second): // a failure bound: the test then fails on its answer
				}
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
				continue
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", next.String())
				if err != nil {
					return
				}
				defer u.Close()
				go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, u)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// waitForReset is a dial wrapper for one upstream: after connecting it
// waits (bounded) until the kernel has taken the peer's RST, standing for
// a proxy slower to write than the upstream is to reset. Nothing of the
// request has been written then.
// The first dial to the target closes dialed once it returned.
func waitForReset(target *atomic.Pointer[netip.AddrPort], dialed chan<- struct{}) func(string, proxy.DialFunc) proxy.DialFunc {
	var once sync.Once
	return func(_ string, d proxy.DialFunc) proxy.DialFunc {
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d(ctx, network, addr)
			tp := target.Load()
			if err != nil || tp == nil || addr != tp.String() {
				return c, err
			}
			once.Do(func() { close(dialed) })
			rc, err := c.(syscall.Conn).SyscallConn()
			if err != nil {
				return c, nil
			}
			// poll(2) until the RST is in the socket (POLLRDHUP, with
			// POLLERR and POLLHUP), at most 5 s, reading nothing.
			rc.Control(func(fd uintptr) {
				for {
					fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
					if _, err := unix.Poll(fds, 5000); err != unix.EINTR {
						return
					}
				}
			})
			return c, nil
		}
	}
}

func TestWitnessNotSentVersusAmbiguous(t *testing.T) {
	var target atomic.Pointer[netip.AddrPort]
	dialed := make(chan struct{})
	n := newNode(t, nodeOpts{wrapDial: waitForReset(&target, dialed)})
	p := n.addPod(t, "web", podOpts{})
	led, up := startLedger(t, p.host4)
	rst := resetFirst(t, p.host4, up, dialed)
	target.Store(&rst)

	// The upstream resets before any byte of the POST left the host: the
	// witness proves it, the evidence is not_sent, and the POST is retried.
	r := p.curl(t, "-X", "POST", "--data", "amount=10", "-H", "Ledger-Id: post-not-sent", url(rst, "/payments"))
	if r.Status != 200 || attempts(r) != 2 {
		t.Fatalf("reset before any byte: status %d attempts %q outcome %q body %q", r.Status,
			r.Headers.Get("Egret-Attempts"), r.Headers.Get("Egret-Outcome"), r.Body)
	}
	if got := led.Executions("post-not-sent"); got != 1 {
		t.Fatalf("executions = %d, want 1", got)
	}
	tr, ok := n.trace(r.Headers.Get("Egret-Request-Id"))
	if !ok || len(tr.Attempts) != 2 {
		t.Fatalf("trace %+v", tr)
	}
	a1 := agent.ViewTrace(tr).Attempts[0]
	wb, wa := tr.Attempts[0].WitnessBefore, tr.Attempts[0].WitnessAfter
	t.Logf("reset before send: attempt 1 %s/%s evidence %s upgraded %v decision %s/%s; witness (%s) before: bytes_sent %d data_segs %d; after: bytes_sent %d data_segs %d reset %v",
		a1.Stage, a1.Failure, a1.Evidence, a1.Upgraded, a1.Decision, a1.Reason, wa.Source,
		wb.BytesSent, wb.DataSegsOut, wa.BytesSent, wa.DataSegsOut, wa.ResetReceived)
	if a1.Evidence != "not_sent" || wa.Source != "ebpf" || wa.BytesSent != 0 || wb.BytesSent != 0 ||
		!wa.HasBytesSent || wa.DataSegsOut != 0 || !wa.ResetReceived {
		t.Fatalf("attempt 1 did not rest on a zero-bytes witness: %+v", a1)
	}

	// The upstream resets after the request's bytes left (it read the
	// head, then reset without executing): the client is told ambiguous.
	target.Store(nil)
	r = p.curl(t, "-X", "POST", "--data", "amount=10", "-H", "Ledger-Id: post-sent", "-H", "Ledger-Fault: reset-before-read", url(up, "/payments"))
	if r.Status != 502 || r.Headers.Get("Egret-Outcome") != "ambiguous" || attempts(r) != 1 {
		t.Fatalf("reset after bytes left: status %d outcome %q attempts %q", r.Status, r.Headers.Get("Egret-Outcome"), r.Headers.Get("Egret-Attempts"))
	}
	tr, _ = n.trace(r.Headers.Get("Egret-Request-Id"))
	a1 = agent.ViewTrace(tr).Attempts[0]
	wb, wa = tr.Attempts[0].WitnessBefore, tr.Attempts[0].WitnessAfter
	t.Logf("reset after send: attempt 1 %s/%s evidence %s decision %s/%s; witness (%s) before: bytes_sent %d; after: bytes_sent %d data_segs %d acked %d reset %v; ledger executions %d",
		a1.Stage, a1.Failure, a1.Evidence, a1.Decision, a1.Reason, wa.Source,
		wb.BytesSent, wa.BytesSent, wa.DataSegsOut, wa.BytesAcked, wa.ResetReceived, led.Executions("post-sent"))
	if a1.Evidence != "sent_no_response" || wa.Source != "ebpf" || wa.BytesSent <= wb.BytesSent || !wa.ResetReceived {
		t.Fatalf("attempt 1: %+v", a1)
	}
	if led.Executions("post-sent") != 0 {
		t.Fatal("reset-before-read executed")
	}
}
