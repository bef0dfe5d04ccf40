package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// testNetns is a network namespace made for one test, with loopback up and
// nat rules that redirect TCP to port 8080 (IPv4 and IPv6 loopback) to the
// proxy's port 15006, except sockets marked 1 (the proxy's own dials).
type testNetns struct {
	name string
	ns   netns.NsHandle
}

func newTestNetns(t *testing.T) *testNetns {
	t.Helper()
	testenv.RequireRoot(t)
	for _, tool := range []string{"ip", "iptables", "ip6tables"} {
		_, err := exec.LookPath(tool)
		testenv.Require(t, err == nil, tool+" (iproute2, iptables)")
	}
	name := fmt.Sprintf("egret-proxy-%d-%d", os.Getpid(), time.Now().UnixNano()%100000)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	in := func(args ...string) { run(append([]string{"ip", "netns", "exec", name}, args...)...) }
	in("ip", "link", "set", "lo", "up")
	for _, ipt := range []string{"iptables", "ip6tables"} {
		dst := "127.0.0.1"
		if ipt == "ip6tables" {
			dst = "::1"
		}
		in(ipt, "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", dst, "--dport", "8080",
			"-m", "mark", "!", "--mark", "1", "-j", "REDIRECT", "--to-ports", "15006")
	}
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return &testNetns{name: name, ns: ns}
}

// do runs fn with the calling thread in the namespace: sockets fn creates
// belong to it for their whole life.
func (n *testNetns) do(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(n.ns); err != nil {
		return err
	}
	defer netns.Set(orig)
	return fn()
}

// dial dials from inside the namespace; mark sets SO_MARK on the socket.
func (n *testNetns) dial(mark int) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := &net.Dialer{}
		if mark != 0 {
			d.Control = func(_, _ string, c syscall.RawConn) error {
				var serr error
				err := c.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, mark)
				})
				if err != nil {
					return err
				}
				return serr
			}
		}
		var c net.Conn
		err := n.do(func() (err error) { c, err = d.DialContext(ctx, network, addr); return })
		return c, err
	}
}

func (n *testNetns) listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := n.do(func() (err error) { ln, err = net.Listen("tcp", addr); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// TestSockoptResolverInNetns: a client in a pod-like namespace connects to
// 127.0.0.1:8080 (and [::1]:8080); the kernel redirects it to the proxy,
// which finds the original destination with SO_ORIGINAL_DST, dials it from
// the namespace with a mark that escapes the redirect, and retries a 503.
func TestSockoptResolverInNetns(t *testing.T) {
	n := newTestNetns(t)
	var hits atomic.Int64
	for _, fam := range []struct{ upstream, proxy, url string }{
		{"127.0.0.1:8080", "127.0.0.1:15006", "http://127.0.0.1:8080/pay"},
		{"[::1]:8080", "[::1]:15006", "http://[::1]:8080/pay"},
	} {
		upl := n.listen(t, fam.upstream)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hits.Add(1)%2 == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintf(w, "host=%s", r.Host)
		})}
		go srv.Serve(upl)
		defer srv.Close()

		pl := n.listen(t, fam.proxy)
		s, err := New(Config{Mode: Transparent, Resolver: SockoptResolver{}, Dial: n.dial(1),
			Policy: mustPolicy(t, fastRetries), Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		go s.Serve(pl)
		defer s.Shutdown(t.Context())

		client := &http.Client{Transport: &http.Transport{DialContext: n.dial(0)}, Timeout: 5 * time.Second}
		resp, err := client.Get(fam.url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get(HeaderAttempts) != "2" {
			t.Fatalf("%s: %d %q attempts %q: the redirect, the original destination or the retry failed",
				fam.url, resp.StatusCode, body, resp.Header.Get(HeaderAttempts))
		}
	}
}

func TestSockoptResolverDirect(t *testing.T) {
	n := newTestNetns(t)
	pl := n.listen(t, "127.0.0.1:15006")
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := pl.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	var c net.Conn
	if err := n.do(func() (err error) { c, err = net.Dial("tcp", "127.0.0.1:8080"); return }); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ac := <-accepted
	defer ac.Close()
	got, err := SockoptResolver{}.OriginalDst(ac)
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.MustParseAddrPort("127.0.0.1:8080"); got != want {
		t.Fatalf("original destination %v, want %v", got, want)
	}
}
