package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestEgretHeadersStripped (finding 5): the Egret-* fields a client sends
// never reach the upstream, in any case and in both modes, on a forwarded
// request and on an upgrade: it sees egret's own Egret-Request-Id only.
func TestEgretHeadersStripped(t *testing.T) {
	forged := "Egret-Outcome: ambiguous\r\nEgret-Attempts: 9\r\negret-attempts: 8\r\nEGRET-OUTCOME: failed\r\n" +
		"Egret-Request-Id: forged\r\nEgret-Timeout-Ms: 5000\r\nEgret-Anything: x\r\nX-Kept: 1\r\n"
	check := func(t *testing.T, what, head, id string) {
		t.Helper()
		if !strings.Contains(head, "X-Kept: 1\r\n") {
			t.Fatalf("%s: the upstream got no request:\n%s", what, head)
		}
		for l := range strings.SplitSeq(head, "\r\n") {
			if len(l) >= 6 && strings.EqualFold(l[:6], "egret-") && (id == "" || l != HeaderRequestID+": "+id) {
				t.Errorf("%s: the upstream got %q", what, l)
			}
		}
	}
	// The upstream answers both an upgrade and a plain request.
	up := listenWire(t, "127.0.0.1:0")
	serveWire(t, up, nil, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "" {
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Upgrade", "test")
			w.WriteHeader(http.StatusSwitchingProtocols)
			return
		}
		io.WriteString(w, "ok")
	})
	// An explicit upgrade may reach only the ports CONNECT may.
	explicit := startProxy(t, Config{Bounds: Bounds{ConnectPorts: []int{int(up.addrPort().Port())}}})
	res := &StaticResolver{Dst: up.addrPort()}
	transparent := startProxy(t, Config{Mode: Transparent, Resolver: res})
	for _, tc := range []struct {
		name, addr, target string
	}{
		{"explicit", explicit.addr, "http://" + up.Addr().String() + "/"},
		{"transparent", transparent.addr, "/"},
	} {
		before := len(up.bytes())
		resp := rawRequest(t, tc.addr, "GET "+tc.target+" HTTP/1.1\r\nHost: x\r\n"+forged+"Connection: close\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", tc.name, resp.StatusCode)
		}
		check(t, tc.name, string(up.bytes()[before:]), resp.Header.Get(HeaderRequestID))

		before = len(up.bytes())
		c := sendRaw(t, tc.addr, "GET "+tc.target+" HTTP/1.1\r\nHost: x\r\n"+forged+"Connection: Upgrade\r\nUpgrade: test\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("%s upgrade: %v %v", tc.name, resp, err)
		}
		c.Close()
		check(t, tc.name+" upgrade", string(up.bytes()[before:]), resp.Header.Get(HeaderRequestID))
	}
}

// FuzzEgretFieldsStripped: whatever field lines a client sends, once
// egret's parser took the head, no Egret-* field is left for the
// upstream, and a field that is neither egret's nor hop-by-hop stays.
func FuzzEgretFieldsStripped(f *testing.F) {
	for _, s := range []string{
		"Egret-Outcome: ambiguous\r\n", "egret-attempts: 3\r\n", "EGRET-REQUEST-ID: x\r\n",
		"Egret-Timeout-Ms: 10\r\n", "Egret-: x\r\n", "Egret-X-Y: 1\r\nX-Kept: 1\r\n",
		"Connection: Egret-Outcome\r\nEgret-Outcome: 1\r\n", "Egret_Outcome: 1\r\n", "Egret-Outcome : 1\r\n",
		"X-Egret-Outcome: 1\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, fields string) {
		req, _, err := parseHead([]byte("GET http://x/ HTTP/1.1\r\nHost: x\r\n" + fields + "\r\n"))
		if err != nil {
			return
		}
		kept := req.Header.Get("X-Kept")
		named := strings.Contains(strings.ToLower(strings.Join(req.Header["Connection"], ",")), "x-kept")
		removeHopHeaders(req.Header)
		for k := range req.Header {
			if len(k) >= 6 && strings.EqualFold(k[:6], "egret-") {
				t.Fatalf("%q: %q left for the upstream", fields, k)
			}
		}
		if !named && req.Header.Get("X-Kept") != kept {
			t.Fatalf("%q: X-Kept %q became %q", fields, kept, req.Header.Get("X-Kept"))
		}
	})
}
