package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent"
)

// openPTY opens a pseudo-terminal pair: the controller, which the test
// reads, and the terminal, a process's stdout.
func openPTY(t *testing.T) (ctl, term *os.File) {
	t.Helper()
	ctl, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("pty: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(ctl.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ctl.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	term, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty: %v", err)
	}
	t.Cleanup(func() { ctl.Close(); term.Close() })
	return ctl, term
}

// upstreamRow finds an upstream's row of egret top's table: its
// requests count and its budget column.
func upstreamRow(table, upstream string) (requests int, budget string, ok bool) {
	for _, l := range strings.Split(table, "\n") {
		f := strings.Fields(l)
		if len(f) == 11 && f[0] == upstream {
			n, err := strconv.Atoi(f[6])
			return n, f[10], err == nil
		}
	}
	return 0, "", false
}

// TestTopAgainstProxy: egret top against a real egret proxy under real
// traffic: --once prints the upstreams' rows (requests, retries,
// ambiguous, not-sent, budget), --sort orders them, -o json is the
// summary, and on a terminal it redraws in place with counts that grow,
// until SIGINT.
func TestTopAgainstProxy(t *testing.T) {
	bin := buildEgret(t)
	p := startLiveProxy(t)
	tr := startTraffic(t, p.addr)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append([]string{"top", "--admin", p.sock}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("egret top %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// -o json: the summary; wait (on the proxy's answers, each a real
	// request) until every kind of request was counted.
	var s agent.Summary
	for {
		if err := json.Unmarshal([]byte(run("--once", "-o", "json")), &s); err != nil {
			t.Fatal(err)
		}
		byName := map[string]agent.UpstreamSummary{}
		for _, u := range s.Upstreams {
			byName[u.Upstream] = u
		}
		l, c := byName[tr.ledger], byName[tr.closed]
		if l.Counts.Retries > 0 && l.Counts.Ambiguous > 0 && c.Counts.NotSent > 0 && s.WindowSeconds > 0 {
			if l.BudgetTokens == nil || c.BudgetTokens == nil {
				t.Fatalf("no budget in the summary: %+v", s.Upstreams)
			}
			break
		}
		tr.waitRounds(10) // a quarter second of traffic more
	}

	once := run("--once", "--sort", "not-sent")
	t.Logf("egret top --once --sort not-sent:\n%s", once)
	if strings.Contains(once, "\x1b[") {
		t.Fatalf("--once to a pipe has escape sequences: %q", once)
	}
	lines := strings.Split(once, "\n")
	var order []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 11 && (f[0] == tr.ledger || f[0] == tr.closed) {
			order = append(order, f[0])
		}
	}
	if len(order) != 2 || order[0] != tr.closed {
		t.Fatalf("--sort not-sent: rows %q, want the closed port's (all not-sent) first", order)
	}
	if n, budget, ok := upstreamRow(once, tr.ledger); !ok || n == 0 || budget == "-" {
		t.Fatalf("ledger's row: requests %d budget %q", n, budget)
	}
	if out, err := exec.Command(bin, "top", "--admin", p.sock, "--sort", "bogus").CombinedOutput(); err == nil || !strings.Contains(string(out), "--sort bogus: expected one of requests") {
		t.Fatalf("--sort bogus: %v %s", err, out)
	}
	if out, err := exec.Command(bin, "top", "--admin", p.sock, "-o", "json").CombinedOutput(); err == nil || !strings.Contains(string(out), "-o json needs --once") {
		t.Fatalf("-o json without --once: %v %s", err, out)
	}

	// Live, on a terminal: each refresh homes and clears the screen and
	// draws the table again, the ledger's requests growing.
	ctl, term := openPTY(t)
	cmd := exec.Command(bin, "top", "--admin", p.sock, "--interval", "200ms")
	cmd.Stdout, cmd.Stderr = term, term
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	term.Close()
	screens := make(chan string, 64)
	go func() {
		defer close(screens)
		r := bufio.NewReader(ctl)
		var cur strings.Builder
		for {
			b, err := r.ReadByte()
			if err != nil {
				return
			}
			cur.WriteByte(b)
			if s := cur.String(); strings.HasSuffix(s, "\x1b[H\x1b[2J") {
				if prev := strings.TrimSuffix(s, "\x1b[H\x1b[2J"); prev != "" {
					screens <- prev
				}
				cur.Reset()
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first, grown := -1, false
	for n := 0; !grown; n++ {
		select {
		case sc, ok := <-screens:
			if !ok {
				t.Fatal("egret top ended")
			}
			reqs, _, ok := upstreamRow(strings.ReplaceAll(sc, "\r", ""), tr.ledger)
			switch {
			case !ok:
			case first < 0:
				first = reqs
			case reqs > first:
				t.Logf("on a terminal: redrawn %d times, ledger's requests %d then %d", n+1, first, reqs)
				grown = true
			}
		case <-ctx.Done():
			t.Fatalf("egret top on a terminal: the ledger's requests did not grow (first %d)", first)
		}
	}
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("egret top after SIGINT: %v, want exit 0", err)
	}
}

// The tables of a node with pods: pods, each pod by upstream, upstreams,
// each sorted by the field asked for (rates highest first, budget least
// left first), a pod's workload shown.
func TestTopTables(t *testing.T) {
	tokens := func(v float64) *float64 { return &v }
	s := agent.Summary{
		Time: time.Now(), WindowSeconds: 10,
		Pods: []agent.PodSummary{
			{Namespace: "shop", Pod: "web", Workload: "deployment/web", State: "running",
				Counts: agent.Counts{Requests: 100, Ambiguous: 7}, Rates: agent.Rates{Requests: 10, Ambiguous: 0.7}},
			{Namespace: "shop", Pod: "worker", Workload: "statefulset/worker", State: "running",
				Counts: agent.Counts{Requests: 300, Retries: 30}, Rates: agent.Rates{Requests: 30, Retries: 3}},
		},
		Flows: []agent.FlowSummary{
			{Namespace: "shop", Pod: "web", Upstream: "orders", Counts: agent.Counts{Requests: 100, Ambiguous: 7}, Rates: agent.Rates{Requests: 10, Ambiguous: 0.7}},
			{Namespace: "shop", Pod: "worker", Upstream: "stock", Counts: agent.Counts{Requests: 300, Retries: 30}, Rates: agent.Rates{Requests: 30, Retries: 3}},
		},
		Upstreams: []agent.UpstreamSummary{
			{Upstream: "orders", Counts: agent.Counts{Requests: 100, Ambiguous: 7}, Rates: agent.Rates{Requests: 10, Ambiguous: 0.7}, BudgetTokens: tokens(80)},
			{Upstream: "stock", Counts: agent.Counts{Requests: 300, Retries: 30}, Rates: agent.Rates{Requests: 30, Retries: 3}, BudgetTokens: tokens(2.5)},
		},
	}
	firsts := func(by string) []string {
		var b strings.Builder
		if err := writeTop(&b, s, by, "sock"); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range strings.Split(b.String(), "\n") {
			switch f := strings.Fields(l); {
			case len(f) > 1 && strings.HasPrefix(f[0], "shop/"):
				out = append(out, f[0]+">"+f[1])
			case len(f) == 11 && (f[0] == "orders" || f[0] == "stock"):
				out = append(out, f[0])
			}
		}
		t.Logf("--sort %s:\n%s", by, b.String())
		return out
	}
	want := map[string]string{
		"ambiguous": "shop/web>deployment/web shop/worker>statefulset/worker shop/web>orders shop/worker>stock orders stock",
		"requests":  "shop/worker>statefulset/worker shop/web>deployment/web shop/worker>stock shop/web>orders stock orders",
		"budget":    "shop/web>deployment/web shop/worker>statefulset/worker shop/web>orders shop/worker>stock stock orders",
	}
	for by, w := range want {
		if got := strings.Join(firsts(by), " "); got != w {
			t.Errorf("--sort %s: rows %q, want %q", by, got, w)
		}
	}
}

// TestTopDirect: the connects egret left direct and the connections it
// passed through are shown per pod and path (and destination), with the
// failures a retry could have fixed safely.
func TestTopDirect(t *testing.T) {
	s := agent.Summary{Time: time.Now(), Direct: []agent.DirectSummary{
		{Namespace: "shop", Pod: "web", Path: "learned_direct", Connects: 9, Established: 4, Refused: 2,
			TimedOut: 1, ResetAfterAck: 3, Retransmits: 6, SafeToRetry: 3, Ambiguous: 3},
		{Namespace: "shop", Pod: "db", Path: "direct_port", Connects: 5, Established: 3, Unreachable: 2, SafeToRetry: 2},
		{Namespace: "shop", Pod: "pay", Path: "passthrough", Protocol: "tls", Destination: "api.example.com:443",
			Connects: 4, Established: 3, Refused: 1, ResetAfterAck: 3, Retransmits: 2, SafeToRetry: 1, Ambiguous: 3},
	}}
	var b strings.Builder
	if err := writeTop(&b, s, "name", "sock"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log(out)
	want := map[string]string{
		"shop/web": "learned_direct - 9 4 2 1 0 0 3 6 3",
		"shop/db":  "direct_port - 5 3 0 0 2 0 0 0 2",
		"shop/pay": "passthrough/tls api.example.com:443 4 3 1 0 0 0 3 2 1",
	}
	rows := 0
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 12 || want[f[0]] == "" {
			continue
		}
		rows++
		if got := strings.Join(f[1:], " "); got != want[f[0]] {
			t.Errorf("%s row %q, want %q", f[0], got, want[f[0]])
		}
	}
	if rows != 3 || !strings.Contains(out, "6 failures a retry could have fixed safely") {
		t.Errorf("direct table:\n%s", out)
	}
}

// TestBudgetShownAlike: egret top's BUDGET column and egret upstreams'
// TOKENS column show the same budget the same way (one decimal), and a
// budget not in use (forgotten after its TTL, or "other") is "-" in top
// with a line that says what "-" is, the same line egret upstreams prints
// when it has no budget in use.
func TestBudgetShownAlike(t *testing.T) {
	v := 99.96
	s := agent.Summary{Time: time.Now(), WindowSeconds: 10, Upstreams: []agent.UpstreamSummary{
		{Upstream: "orders", Counts: agent.Counts{Requests: 5}, BudgetTokens: &v},
		{Upstream: "stock", Counts: agent.Counts{Requests: 3}},
	}}
	var top, ups, none strings.Builder
	if err := writeTop(&top, s, "name", "sock"); err != nil {
		t.Fatal(err)
	}
	if err := writeUpstreams(&ups, []agent.UpstreamStatus{{Upstream: "orders", Tokens: v}}); err != nil {
		t.Fatal(err)
	}
	if err := writeUpstreams(&none, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("top:\n%s\nupstreams:\n%s\nupstreams, none in use:\n%s", top.String(), ups.String(), none.String())
	if _, b, ok := upstreamRow(top.String(), "orders"); !ok || b != "100.0" {
		t.Errorf("top's budget of orders: %q, want 100.0", b)
	}
	if _, b, ok := upstreamRow(top.String(), "stock"); !ok || b != "-" {
		t.Errorf("top's budget of stock (none in use): %q, want -", b)
	}
	var tokens string
	for _, l := range strings.Split(ups.String(), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "orders" {
			tokens = f[1]
		}
	}
	if tokens != "100.0" {
		t.Errorf("upstreams' tokens of orders: %q, want 100.0 as top shows it", tokens)
	}
	if !strings.Contains(top.String(), budgetNone) || !strings.Contains(none.String(), budgetNone) {
		t.Errorf("no line saying what - is: top %q, upstreams %q", top.String(), none.String())
	}
	if strings.Contains(ups.String(), budgetNone) {
		t.Errorf("upstreams with a budget in use explains -: %q", ups.String())
	}
}
