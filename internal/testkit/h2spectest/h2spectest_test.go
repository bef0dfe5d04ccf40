package h2spectest

import (
	"io"
	"log"
	"net"
	"net/http"
	"testing"
	"time"
)

// h2spec against net/http's own HTTP/2 server (h2c prior knowledge): the
// build, the run and the reading of its report work; a server that closes
// every connection fails every case it is given. (Go 1.26's server fails
// a handful of h2spec's cases itself; they are logged, as a baseline for
// servers built on it.)
func TestRunAgainstNetHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &p, ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	res := Run(t, t.Context(), "127.0.0.1", port, 2*time.Second)
	if len(res.Cases) < 100 {
		t.Fatalf("%d cases, want h2spec's 140-odd\n%s", len(res.Cases), res.Output)
	}
	for _, c := range res.Failures() {
		t.Logf("net/http fails %s %s: %s", c.ID, c.Title, c.Failed)
	}
	if passed := len(res.Cases) - len(res.Failures()); passed < 100 {
		t.Fatalf("net/http passes %d of %d cases\n%s", passed, len(res.Cases), res.Output)
	}
	t.Logf("%d cases, %d failed", len(res.Cases), len(res.Failures()))

	// A server that closes every connection at once fails every case.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dead.Close() })
	go func() {
		for {
			c, err := dead.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	res = Run(t, t.Context(), "127.0.0.1", dead.Addr().(*net.TCPAddr).Port, time.Second, "http2/4.1")
	if len(res.Cases) == 0 || len(res.Failures()) != len(res.Cases) {
		t.Fatalf("against a closing server: %d cases, %d failed\n%s", len(res.Cases), len(res.Failures()), res.Output)
	}
	if id := res.Cases[0].ID; id != "http2/4.1/1" {
		t.Errorf("first case of http2/4.1 named %q", id)
	}
}
