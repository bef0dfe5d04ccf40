package cli

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/browsertest"
	"github.com/egret-proxy/egret/test/ledger"
)

// liveProxy is a real `egret proxy` process with --metrics and --admin.
type liveProxy struct {
	addr, metrics, sock string
}

// startLiveProxy runs the egret binary as `egret proxy` on loopback
// ports it picks, with the admin socket in a temporary directory, until
// the test ends.
func startLiveProxy(t *testing.T) liveProxy {
	t.Helper()
	bin := buildEgret(t)
	sock := filepath.Join(t.TempDir(), "egret.sock")
	cmd := exec.Command(bin, "proxy", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--admin", sock, "--access-log", "off")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default: // nobody reads once started
			}
		}
		close(lines)
	}()
	addrRe := regexp.MustCompile(`msg="egret proxy listening" addr=(\S+)`)
	pageRe := regexp.MustCompile(`msg="egret node page" url=http://(\S+)/`)
	var p liveProxy
	p.sock = sock
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for p.addr == "" || p.metrics == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("egret proxy exited before listening")
			}
			if m := addrRe.FindStringSubmatch(l); m != nil {
				p.addr = m[1]
			}
			if m := pageRe.FindStringSubmatch(l); m != nil {
				p.metrics = m[1]
			}
		case <-timeout.C:
			t.Fatalf("egret proxy: no listening and node page lines within 30 s (%+v)", p)
		}
	}
	return p
}

// traffic sends, through an egret proxy, rounds of four requests each
// until stopped or bounded out: a relayed GET, a GET retried once after
// a 503, a POST the ledger resets after executing (ambiguous: not
// retried) and a GET to a closed port (not-sent). It records the request
// ids egret gave each outcome.
type traffic struct {
	ledger, closed string
	client         *http.Client
	rounds         atomic.Int64

	mu      sync.Mutex
	ids     map[string][]string // by Egret-Outcome ("" for relayed)
	changed chan struct{}       // closed and replaced at each id recorded
}

// closedPort is a loopback address nothing listens on (bound, then
// closed: a connect to it is refused).
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

func startTraffic(t *testing.T, proxyAddr string) *traffic {
	t.Helper()
	_, up := ledger.Start(t)
	tr := &traffic{
		ledger: up.String(), closed: closedPort(t), ids: map[string][]string{}, changed: make(chan struct{}),
		client: &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxyAddr})}, Timeout: 10 * time.Second},
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		// Paced and bounded: at most 3000 rounds, one each 25 ms.
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for n := range 3000 {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			id := "page-" + strconv.Itoa(n)
			tr.do("GET", "http://"+tr.ledger+"/ok", id+"-ok", "")
			tr.do("GET", "http://"+tr.ledger+"/flaky", id+"-503", "503; times=1")
			tr.do("POST", "http://"+tr.ledger+"/pay?card=4111111111111111", id+"-pay", "reset-after-read")
			tr.do("GET", "http://"+tr.closed+"/gone", id+"-gone", "")
			tr.rounds.Add(1)
		}
	}()
	return tr
}

func (tr *traffic) do(method, u, id, fault string) {
	var body *strings.Reader
	if method == "POST" {
		body = strings.NewReader("amount=1")
	} else {
		body = strings.NewReader("")
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		return
	}
	req.Header.Set(ledger.HeaderID, id)
	if fault != "" {
		req.Header.Set(ledger.HeaderFault, fault)
	}
	resp, err := tr.client.Do(req)
	if err != nil {
		return
	}
	resp.Body.Close()
	tr.mu.Lock()
	o := resp.Header.Get("Egret-Outcome")
	tr.ids[o] = append(tr.ids[o], resp.Header.Get("Egret-Request-Id"))
	close(tr.changed)
	tr.changed = make(chan struct{})
	tr.mu.Unlock()
}

// waitRounds waits until n more rounds of requests were answered.
func (tr *traffic) waitRounds(n int64) {
	until := tr.rounds.Load() + n
	for {
		tr.mu.Lock()
		ch := tr.changed
		tr.mu.Unlock()
		if tr.rounds.Load() >= until {
			return
		}
		<-ch
	}
}

// gave waits until the client got request id answered with outcome
// (the page may list it a moment before the client has read its answer);
// false if ctx ends first.
func (tr *traffic) gave(ctx context.Context, outcome, id string) bool {
	for {
		tr.mu.Lock()
		for _, x := range tr.ids[outcome] {
			if x == id {
				tr.mu.Unlock()
				return true
			}
		}
		ch := tr.changed
		tr.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// cell is the JavaScript of the text of column col (from 1) in the row
// of table whose first cell is key.
func cell(table, key string, col int) string {
	return fmt.Sprintf(`(() => { for (const r of document.querySelectorAll(%q)) { const c = r.cells;
  if (c.length > %d && c[0].innerText.trim() === %q) return c[%d].innerText.trim(); } return null; })()`,
		"#"+table+" tbody tr", col-1, key, col-1)
}

// TestNodePageInChromium: a real egret proxy under real traffic (relayed,
// retried, ambiguous, not-sent); its node page, loaded in headless
// Chromium during the traffic, shows a row for each upstream with counts
// that grow while a person watches, the ambiguous and not-sent requests
// with their reasons, and the ambiguous request's link opens its
// explanation, which shows no query string.
func TestNodePageInChromium(t *testing.T) {
	b := browsertest.Start(t)
	p := startLiveProxy(t)
	tr := startTraffic(t, p.addr)
	page := b.NewPage(t)
	browsertest.ScreenshotOnFailure(t, page)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	if err := page.Navigate(ctx, "http://"+p.metrics+"/"); err != nil {
		t.Fatal(err)
	}

	// The ledger's row, its requests counted; then counted more, without
	// a reload: the page is live.
	var first string
	if err := page.WaitFor(ctx, cell("upstreams", tr.ledger, 7)+` > 0 && `+cell("upstreams", tr.ledger, 7), &first); err != nil {
		t.Fatal(err)
	}
	n1, _ := strconv.Atoi(first)
	var later string
	if err := page.WaitFor(ctx, fmt.Sprintf(`(+%s > %d) && %s`, cell("upstreams", tr.ledger, 7), n1+8, cell("upstreams", tr.ledger, 7)), &later); err != nil {
		t.Fatal(err)
	}
	n2, _ := strconv.Atoi(later)
	t.Logf("ledger's requests on the page: %d, then %d without a reload (%d rounds sent, %.1fs)", n1, n2, tr.rounds.Load(), time.Since(start).Seconds())
	// Rates once two samples are a second apart; retries and ambiguous
	// answers of the ledger, not-sent of the closed port, both counted.
	var rate string
	if err := page.WaitFor(ctx, fmt.Sprintf(`(+%s > 0) && %s`, cell("upstreams", tr.ledger, 2), cell("upstreams", tr.ledger, 2)), &rate); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		upstream string
		col      int
		what     string
	}{{tr.ledger, 8, "retries"}, {tr.ledger, 9, "ambiguous"}, {tr.closed, 10, "not-sent"}} {
		var v string
		if err := page.WaitFor(ctx, fmt.Sprintf(`(+%s > 0) && %s`, cell("upstreams", c.upstream, c.col), cell("upstreams", c.upstream, c.col)), &v); err != nil {
			t.Fatalf("%s of %s: %v", c.what, c.upstream, err)
		}
		t.Logf("%s %s: %s", c.upstream, c.what, v)
	}
	t.Logf("ledger's requests/s on the page: %s", rate)

	// The recent list: an ambiguous POST to the ledger (reason: it may
	// have run, no response) and a not-sent GET to the closed port.
	recentRow := func(outcome, upstream string) string {
		return fmt.Sprintf(`(() => { for (const r of document.querySelectorAll("#recent tbody tr")) { const c = r.cells;
  if (c.length === 7 && c[5].innerText === %q && c[3].innerText === %q) return c[1].innerText + " " + c[4].innerText + " " + c[6].innerText; } return null; })()`, outcome, upstream)
	}
	var amb, ns string
	if err := page.WaitFor(ctx, recentRow("ambiguous", tr.ledger), &amb); err != nil {
		t.Fatal(err)
	}
	if err := page.WaitFor(ctx, recentRow("not-sent", tr.closed), &ns); err != nil {
		t.Fatal(err)
	}
	t.Logf("recent: ambiguous %q, not-sent %q", amb, ns)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if f := strings.Fields(amb); len(f) != 3 || f[1] != "POST" || f[2] != "no_response" || !tr.gave(wctx, "ambiguous", f[0]) {
		t.Fatalf("ambiguous row %q: want an id the client got with Egret-Outcome: ambiguous, POST, no_response", amb)
	}
	// Retried to its last attempt, or denied a retry once the closed
	// port's budget is spent (each not-sent GET takes two).
	if f := strings.Fields(ns); len(f) != 3 || f[1] != "GET" || (f[2] != "max_attempts" && f[2] != "budget_exhausted") || !tr.gave(wctx, "not-sent", f[0]) {
		t.Fatalf("not-sent row %q: want an id the client got with Egret-Outcome: not-sent, GET, max_attempts or budget_exhausted", ns)
	}

	// A person clicks the ambiguous request's id: its explanation.
	id := strings.Fields(amb)[0]
	if err := page.ClickToLoad(ctx, `#recent a[href="/explain/`+id+`"]`); err != nil {
		t.Fatal(err)
	}
	var headline string
	if err := page.WaitFor(ctx, `location.pathname === "/explain/`+id+`" && document.getElementById("headline") && document.getElementById("headline").innerText`, &headline); err != nil {
		t.Fatal(err)
	}
	if want := "Request " + id + ": ambiguous after 1 attempt"; headline != want {
		t.Fatalf("explanation headline %q, want %q", headline, want)
	}
	text, err := page.Text(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(text, "\n")
	for _, want := range []string{"could not prove the upstream did not run this request", "POST", "http://" + tr.ledger + "/pay", tr.ledger, "no_response"} {
		if !strings.Contains(all, want) {
			t.Errorf("explanation lacks %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "4111") || strings.Contains(all, "card=") {
		t.Errorf("explanation shows the URL's query:\n%s", all)
	}
	if pr := page.Problems(); len(pr) > 0 {
		t.Errorf("the page logged errors (a CSP refusal, a script error): %q", pr)
	}
}
