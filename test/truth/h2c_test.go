//go:build linux

package truth

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/witness"
)

// TestTruthH2C is the truth suite with the client speaking HTTP/2 to
// egret (h2c, prior knowledge), as a pod does, in transparent mode (issue
// 23): the same plan of faults and the same checks as TestTruth (0
// duplicate executions of a non-idempotent request, 0 false not-sent),
// every request one stream on the few connections the client keeps to
// egret per destination.
func TestTruthH2C(t *testing.T) {
	n := 5000
	if v := os.Getenv("EGRET_TRUTH_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("EGRET_TRUTH_N=%q: want a positive number", v)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("EGRET_TRUTH_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("EGRET_TRUTH_SEED=%q: %v", v, err)
		}
	}
	t.Logf("seed %d (EGRET_TRUTH_SEED=%d reproduces the plan), %d requests over h2c", seed, seed, n)

	u := startUpstreams(t)
	res := &proxy.StaticResolver{}
	addr, traces := startTransparentEgret(t, u.policyFor(truthDefaults), res)
	const workers = 32
	c := h2cClient(addr, res)
	specs := plan(seed, n)
	for i := range specs {
		specs[i].h2client = true
	}
	answers := make([]answer, n)

	start := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range work {
				answers[i] = do(c, u.request(specs[i]))
			}
		})
	}
	for i := range specs {
		work <- i
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	c.CloseIdleConnections()

	records := u.ledger.Records()
	stats := u.ledger.Stats()
	v := check(specs, answers, records, stats, explainer(traces))
	table := faultTable(specs, answers, records)
	t.Logf("%d requests over h2c in %v (%.0f/s); ledger: %d arrivals, %d executions, %d key replays, %d idle closes, %d reuse resets, %d connections\n%s",
		n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), stats.Arrivals, stats.Executions,
		stats.Replays, stats.IdleCloses, stats.ReuseResets, stats.Connections, table)
	for _, line := range v.report() {
		t.Error(line)
	}
	v.coverage(t, specs, answers, records)
}

// startTransparentEgret runs an egret proxy in transparent mode on
// loopback with the policy document, each connection's original
// destination told by res, and returns its address.
func startTransparentEgret(t *testing.T, doc string, res proxy.Resolver) (string, *proxy.Traces) {
	t.Helper()
	pol, err := policy.Parse("truth-policy.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("policy: %v\n%s", err, doc)
	}
	srv, err := proxy.New(proxy.Config{
		Mode:     proxy.Transparent,
		Resolver: res,
		Policy:   proxy.StaticPolicy{P: pol},
		Shared:   proxy.Shared{Witness: witness.TCPInfo{}},
		Traces:   proxy.NewTraces(1 << 15),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	})
	return ln.Addr().String(), srv.Traces()
}

// h2cClient speaks HTTP/2 with prior knowledge to egret at addr for every
// URL, as a pod whose connections are redirected: each connection's
// local port is bound before it connects and told to res with the URL's
// host as its original destination.
func h2cClient(addr string, res *proxy.StaticResolver) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{
		Transport: &http.Transport{
			Protocols:          &p,
			DisableCompression: true,
			IdleConnTimeout:    30 * time.Second,
			DialContext: func(ctx context.Context, _, target string) (net.Conn, error) {
				dst, err := netip.ParseAddrPort(target)
				if err != nil {
					return nil, fmt.Errorf("h2c client: %q: %w", target, err)
				}
				d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
					var err error
					if cerr := rc.Control(func(fd uintptr) {
						err = bindAndTell(int(fd), dst, res)
					}); cerr != nil {
						return cerr
					}
					return err
				}}
				return d.DialContext(ctx, "tcp4", addr)
			},
		},
		Timeout: 20 * time.Second,
	}
}

// bindAndTell binds the socket fd to a loopback port of the kernel's
// choosing and tells res that connections from it go to dst.
func bindAndTell(fd int, dst netip.AddrPort, res *proxy.StaticResolver) error {
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return err
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return err
	}
	in, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		return fmt.Errorf("bound to %T", sa)
	}
	res.Set(netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port)), dst)
	return nil
}
