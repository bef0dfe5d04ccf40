// Command report runs the smuggling corpus through egret (explicit and
// transparent mode, in process) and through HAProxy (/usr/sbin/haproxy, a
// process of its own, origin-form requests), each in front of the same
// strict upstream, and prints each one's counts and where HAProxy and
// egret's transparent mode (the same origin-form bytes) differ, and why.
// Not run in CI. From the repository's root:
//
//	go run ./test/smuggle/cmd/report [-cases PREFIX] [-all]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/egret-proxy/egret/test/smuggle"
)

func main() {
	haproxy := flag.String("haproxy", "/usr/sbin/haproxy", "the HAProxy binary (Debian: apt-get install haproxy)")
	prefix := flag.String("cases", "", "run only the cases whose id starts with this")
	corpus := flag.String("corpus", "test/smuggle/testdata/cases.jsonl", "the corpus")
	all := flag.Bool("all", false, "list every differing case, not a few per group")
	flag.Parse()
	cases, err := smuggle.LoadCases(*corpus)
	if err != nil {
		log.Fatal(err)
	}
	if *prefix != "" {
		var keep []smuggle.Case
		for _, c := range cases {
			if strings.HasPrefix(c.ID, *prefix) {
				keep = append(keep, c)
			}
		}
		cases = keep
	}
	results := map[string][]verdict{}
	for _, mode := range []smuggle.Mode{smuggle.Explicit, smuggle.Transparent} {
		e, err := smuggle.NewEgret(mode)
		if err != nil {
			log.Fatal(err)
		}
		results["egret "+string(mode)] = runEgret(e, cases)
	}
	hv, version, err := runHAProxy(*haproxy, cases)
	if err != nil {
		log.Fatal(err)
	}
	results["haproxy"] = hv

	fmt.Printf("corpus: %d cases; HAProxy: %s\n\n", len(cases), version)
	fmt.Printf("%-19s %6s %8s %9s %6s %7s %7s\n", "target", "cases", "refused", "forwarded", "piped", "desync", "stalled")
	for _, name := range []string{"egret explicit", "egret transparent", "haproxy"} {
		n := map[string]int{}
		stalled := 0
		for _, v := range results[name] {
			n[v.Class]++
			if v.stalled {
				stalled++
			}
		}
		fmt.Printf("%-19s %6d %8d %9d %6d %7d %7d\n", name, len(results[name]), n[smuggle.Refused], n[smuggle.Forwarded], n[smuggle.Piped], n[smuggle.Desync], stalled)
	}
	fmt.Println("\nDesyncs by kind: sequence (the upstream read a request the proxy did not log, or")
	fmt.Println("missed or repeated one it did, or a forged egret field), unframeable (the proxy")
	fmt.Println("forwarded bytes the strict parser refuses; what it logged is all it sent)")
	for _, name := range []string{"egret explicit", "egret transparent", "haproxy"} {
		seq, unf := 0, 0
		for _, v := range results[name] {
			if v.Class != smuggle.Desync {
				continue
			}
			if sequence(v.Reasons) {
				seq++
			} else {
				unf++
			}
		}
		fmt.Printf("  %-19s sequence %d, unframeable %d\n", name, seq, unf)
	}
	for _, name := range []string{"egret explicit", "egret transparent", "haproxy"} {
		fmt.Printf("\n%s: desyncs\n", name)
		none := true
		for i, v := range results[name] {
			if v.Class == smuggle.Desync {
				none = false
				fmt.Printf("  %s: %s\n", cases[i].ID, strings.Join(v.Reasons, "; "))
			}
		}
		if none {
			fmt.Println("  none")
		}
	}

	// Where egret (transparent: the same origin-form bytes) and HAProxy
	// differ, grouped by the two verdicts and the class of trick.
	type group struct{ pair, class string }
	groups := map[group][]int{}
	for i := range cases {
		e, h := results["egret transparent"][i], results["haproxy"][i]
		if e.Class != h.Class {
			groups[group{"egret " + e.Class + " / haproxy " + h.Class, cases[i].Class}] = append(groups[group{"egret " + e.Class + " / haproxy " + h.Class, cases[i].Class}], i)
		}
	}
	keys := make([]group, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool {
		if keys[a].pair != keys[b].pair {
			return keys[a].pair < keys[b].pair
		}
		return keys[a].class < keys[b].class
	})
	fmt.Printf("\negret (transparent) and HAProxy differ on %d cases\n", func() int {
		n := 0
		for _, g := range groups {
			n += len(g)
		}
		return n
	}())
	for _, k := range keys {
		idx := groups[k]
		fmt.Printf("\n%s, %s: %d cases\n", k.pair, k.class, len(idx))
		for j, i := range idx {
			if j == 6 && !*all {
				fmt.Printf("  ... %d more (-all lists them)\n", len(idx)-j)
				break
			}
			e, h := results["egret transparent"][i], results["haproxy"][i]
			fmt.Printf("  %s\n    raw    %q\n    egret  %s\n    haproxy %s\n", cases[i].ID, clip(cases[i].Raw, 100), e.why, h.why)
		}
	}
}

// sequence reports whether a desync's reasons show another request
// sequence upstream than the log, rather than only bytes the strict parser
// refused (with the request they held, logged but not read, as its
// consequence).
func sequence(reasons []string) bool {
	for _, r := range reasons {
		switch {
		case strings.Contains(r, "which the proxy did not log"), strings.Contains(r, "times, logged with"),
			strings.Contains(r, "reached the upstream with"), strings.Contains(r, "left inside a request"),
			strings.Contains(r, "bytes after a request that closes"), strings.Contains(r, "no upstream connection carried"):
			return true
		}
	}
	return false
}

type verdict struct {
	smuggle.Verdict
	stalled bool
	why     string
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func runEgret(e *smuggle.Egret, cases []smuggle.Case) []verdict {
	out := make([]verdict, len(cases))
	var wg sync.WaitGroup
	next := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				r, err := e.Run(&cases[i])
				if err != nil {
					log.Fatalf("%s: %v", cases[i].ID, err)
				}
				out[i] = verdict{Verdict: r.Verdict, stalled: r.Stalled, why: describe(r.Logs, r.Verdict)}
			}
		})
	}
	for i := range cases {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

func describe(logs []smuggle.Logged, v smuggle.Verdict) string {
	var parts []string
	for _, l := range logs {
		s := fmt.Sprintf("%s %d", l.Outcome, l.Status)
		if l.Err != "" {
			s += " (" + l.Err + ")"
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		parts = append(parts, "no log line")
	}
	s := strings.Join(parts, ", ") + "; upstream read " + strings.Join(v.Upstream, ", ")
	if len(v.Upstream) == 0 {
		s += "nothing"
	}
	return s
}

// HAProxy's log line: client address and port, unique id, method, URI,
// status, server (<NOSRV>: not forwarded), termination state, retries.
var haLine = regexp.MustCompile(`^SMUGGLE (\S+) (\d+) (\S+) (\S+) "(.*)" (-?\d+) (\S+) (\S+) (-?\d+)$`)

const idHeader = "X-Smuggle-Id"

func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// runHAProxy runs the cases one at a time through one HAProxy whose only
// server is a strict upstream started again for each case on the same
// port. Each case's connection comes from an address of its own in
// 127.0.0.0/8, which HAProxy logs: that is how its lines find their case.
func runHAProxy(bin string, cases []smuggle.Case) ([]verdict, string, error) {
	vout, err := exec.Command(bin, "-v").Output()
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w (Debian: apt-get install haproxy)", bin, err)
	}
	version := strings.SplitN(string(vout), "\n", 2)[0]
	dir, err := os.MkdirTemp("", "smuggle-haproxy")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(dir)
	fe, upPort := freePort(), freePort()
	upAddr := "127.0.0.1:" + strconv.Itoa(upPort)
	cfg := fmt.Sprintf(`global
  log stdout format raw local0
  maxconn 4096
defaults
  mode http
  log global
  timeout connect 2s
  timeout client 5s
  timeout server 3s
  timeout http-request 3s
frontend fe
  bind 127.0.0.1:%d
  unique-id-format %%ci_%%cp_%%rt
  http-request set-header %s %%[unique-id]
  log-format "SMUGGLE %%ci %%cp %%ID %%HM %%{+Q}HU %%ST %%s %%tsc %%rc"
  default_backend be
backend be
  server up %s
`, fe, idHeader, upAddr)
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, "", err
	}
	cmd := exec.Command(bin, "-db", "-f", path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var mu sync.Mutex
	lines := map[string][]smuggle.Logged{}
	marker := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			m := haLine.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			st, _ := strconv.Atoi(m[6])
			rc, _ := strconv.Atoi(m[9])
			l := smuggle.Logged{ID: m[3], Method: m[4], URL: m[5], Status: st, Attempts: 1 + max(rc, 0), Outcome: "relayed"}
			if m[7] == "<NOSRV>" {
				l.Outcome, l.Attempts = "rejected", 0
			}
			l.Err = "termination " + m[8]
			if m[5] == "/marker-end" {
				close(marker)
				continue
			}
			mu.Lock()
			lines[m[1]] = append(lines[m[1]], l)
			mu.Unlock()
		}
	}()
	feAddr := "127.0.0.1:" + strconv.Itoa(fe)
	for range 100 { // HAProxy starting: wait for its listener
		if c, err := net.Dial("tcp", feAddr); err == nil {
			c.Close()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	type run struct {
		raw     []byte
		conns   [][]byte
		answer  []byte
		stalled bool
	}
	runs := make([]run, len(cases))
	ipOf := func(i int) net.IP { return net.IPv4(127, 1+byte(i/62500), byte(i/250%250), byte(i%250+1)) }
	for i := range cases {
		up, err := smuggle.StartUpstreamOn(upAddr)
		for try := 0; err != nil && try < 50; try++ {
			time.Sleep(20 * time.Millisecond)
			up, err = smuggle.StartUpstreamOn(upAddr)
		}
		if err != nil {
			return nil, "", err
		}
		raw, err := cases[i].Expand(smuggle.Transparent, feAddr)
		if err != nil {
			return nil, "", err
		}
		answer, stalled, err := smuggle.Exchange(&net.TCPAddr{IP: ipOf(i)}, feAddr, raw)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", cases[i].ID, err)
		}
		runs[i] = run{raw: raw, conns: up.Finish(), answer: answer, stalled: stalled}
	}
	// A last request, its log line after every case's.
	if c, err := net.Dial("tcp", feAddr); err == nil {
		up, _ := smuggle.StartUpstreamOn(upAddr)
		io.WriteString(c, "GET /marker-end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		io.ReadAll(c)
		c.Close()
		select {
		case <-marker:
		case <-time.After(10 * time.Second):
			log.Print("HAProxy's last log line did not come: some lines may be missing")
		}
		if up != nil {
			up.Finish()
		}
	}
	out := make([]verdict, len(cases))
	mu.Lock()
	defer mu.Unlock()
	for i, r := range runs {
		logs := lines[ipOf(i).String()]
		v := smuggle.JudgeWith(r.raw, logs, r.conns, false, idHeader, false)
		out[i] = verdict{Verdict: v, stalled: r.stalled, why: describe(logs, v)}
	}
	return out, version, nil
}
