//go:build linux

package retry

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/retry/client"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

func TestSOMark(t *testing.T) {
	testenv.RequireRoot(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	base := client.NewHTTPTransport(client.HTTPOptions{Mark: 0x2a})
	defer base.CloseIdleConnections()
	var conn net.Conn
	req := rawtest.Get(t, srv.URL)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { conn = i.Conn },
	}))
	resp, err := (&Transport{Base: base}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	raw, err := attempt.RawConnOf(conn)
	if err != nil {
		t.Fatal(err)
	}
	var mark int
	var serr error
	raw.Control(func(fd uintptr) { mark, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) })
	if serr != nil || mark != 0x2a {
		t.Fatalf("SO_MARK = %#x (%v), want 0x2a", mark, serr)
	}
}
