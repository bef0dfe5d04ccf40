package agent

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/proxy"
)

// GET /observe over the admin socket: a follower that stops reading while
// 3,000 requests go through misses some of them (the request path does
// not wait for it) and is told exactly how many: what it got plus what it
// was told it lost is every request. Bad parameters are refused.
func TestObserveStreamTellsLostEvents(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	budgets := engine.NewBudgets()
	srv, ln := serveProxy(t, proxy.Config{Mode: proxy.Explicit, Shared: proxy.Shared{Budgets: budgets, Tap: proxy.NewTap(16)}})
	// The socket listens before anything asks it: no waiting for it.
	sock := filepath.Join(t.TempDir(), "admin.sock")
	aln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: AdminHandler(&Standalone{Server: srv, Budgets: budgets})}
	go hs.Serve(aln)
	defer hs.Close()
	admin := AdminClient(sock)
	admin.Timeout = 0
	// The answer's header comes once the observer is registered.
	resp, err := admin.Get("http://egret/observe?follow=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("/observe: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}

	const n = 3000
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()})}}
	start := time.Now()
	var last string
	for range n {
		r, err := client.Get(up.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		last = r.Header.Get(proxy.HeaderRequestID)
	}
	took := time.Since(start)

	var events, lost uint64
	var lastSeen string
	sc := bufio.NewScanner(resp.Body)
	for events+lost < n && sc.Scan() {
		var line struct {
			LostEvents *uint64 `json:"lost_events"`
			RequestID  string  `json:"request_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if line.LostEvents != nil {
			lost += *line.LostEvents
			continue
		}
		events++
		lastSeen = line.RequestID
	}
	if events+lost != n || lost == 0 {
		t.Fatalf("%d events and %d told lost of %d requests: %v", events, lost, n, sc.Err())
	}
	t.Logf("%d requests in %v while the observer did not read: it got %d, was told of %d lost (the newest, %s, among them: %v)",
		n, took.Round(time.Millisecond), events, lost, last, lastSeen != last)
	// Caught up, it gets the next request.
	r, err := client.Get(up.URL + "/next")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if !sc.Scan() || !strings.Contains(sc.Text(), `"request_id":"`+r.Header.Get(proxy.HeaderRequestID)+`"`) {
		t.Fatalf("after catching up: %q %v", sc.Text(), sc.Err())
	}
	last = r.Header.Get(proxy.HeaderRequestID)

	// The past alone, filtered; and what is refused.
	get := func(query string) (int, string) {
		t.Helper()
		r, err := AdminClient(sock).Get("http://egret/observe?" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b)
	}
	if code, body := get("last=3&outcome=relayed"); code != 200 || strings.Count(body, "\n") != 3 || !strings.Contains(body, `"request_id":"`+last+`"`) {
		t.Errorf("last=3: %d %q", code, body)
	}
	for _, q := range []string{"outcome=bogus", "last=-1", "follow=maybe"} {
		if code, body := get(q); code != http.StatusBadRequest || !strings.Contains(body, "error") {
			t.Errorf("%s: %d %q", q, code, body)
		}
	}
	r, err = AdminClient(sock).Get("http://egret/policy?pod=web")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusNotFound {
		t.Errorf("/policy?pod=web of a lone proxy: %s", r.Status)
	}
	r, err = AdminClient(sock).Get("http://egret/policy?dest=no-port")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusBadRequest {
		t.Errorf("/policy?dest=no-port: %s", r.Status)
	}
}
