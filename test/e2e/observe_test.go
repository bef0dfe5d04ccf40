package e2e

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
)

// TestObservePolicyStatusAgainstTheAgent asks a running agent, through the
// egret command line, what its pods' requests did (observe, filtered and
// followed), the effective policy of a pod with and without an override
// (policy), and its version, kernel and eBPF features (status), in JSON and
// as tables.
func TestObservePolicyStatusAgainstTheAgent(t *testing.T) {
	pol, err := policy.Parse("node.yaml", []byte("defaults:\n  timeout: 5s\n"))
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, nodeOpts{proxy: proxy.Config{Policy: proxy.StaticPolicy{P: pol}}})
	web := n.addPod(t, "shop/web", podOpts{})
	worker := n.addPod(t, "blog/worker", podOpts{spec: pods.Pod{Policy: []byte("defaults:\n  max_attempts: 1\n")}})
	_, up := startLedger(t, web.host4)

	// The socket listens before anything asks it: no waiting for it.
	sock := filepath.Join(t.TempDir(), "admin.sock")
	aln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: agent.WithAbout(n.agent.Admin(), "e2e-version", true)}
	go hs.Serve(aln)
	t.Cleanup(func() { hs.Close() })
	bin := egretBinary(t)
	egret := func(args ...string) string {
		t.Helper()
		// Flags before the arguments (urfave/cli stops at the first).
		cmd := exec.Command(bin, append([]string{args[0], "--admin", sock}, args[1:]...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("egret %v: %v\n%s%s", args, err, out, stderr.String())
		}
		return string(out)
	}
	// A follower of namespace shop from before any request (--last: what
	// was answered before it started watching comes first, none twice).
	follow := exec.Command(bin, "observe", "--admin", sock, "--follow", "--last", "100", "-o", "json", "--namespace", "shop")
	stdout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var followErr strings.Builder
	follow.Stderr = &followErr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follow.Process.Kill(); follow.Wait() })
	events := make(chan proxy.Event, 16)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e proxy.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Errorf("observe line %q: %v", sc.Text(), err)
				return
			}
			events <- e
		}
	}()
	next := func() proxy.Event {
		t.Helper()
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("observe --follow ended: %s", followErr.String())
			}
			return e
		case <-time.After(20 * time.Second):
			t.Fatal("no event from observe --follow")
		}
		return proxy.Event{}
	}

	get := func(p *pod, id string) response {
		t.Helper()
		return p.curl(t, "-H", "Ledger-Id: "+id, "-H", "Ledger-Fault: 503; times=1", url(up, "/"+id))
	}
	web1 := get(web, "web-1")
	wk := get(worker, "worker-1")
	web2 := get(web, "web-2")
	if web1.Status != 200 || attempts(web1) != 2 || wk.Status != 503 || attempts(wk) != 1 {
		t.Fatalf("web %d after %d attempts, worker %d after %d", web1.Status, attempts(web1), wk.Status, attempts(wk))
	}
	id := func(r response) string { return r.Headers.Get("Egret-Request-Id") }

	// The follower sees web's two requests, and not worker's between them.
	e := next()
	if e.RequestID != id(web1) || e.Namespace != "shop" || e.Pod != "web" || e.Upstream != up.String() ||
		e.Outcome != "relayed" || e.Attempts != 2 || e.Reason != "status" || e.Status != 200 || e.Duration <= 0 ||
		e.URL != "/web-1" {
		t.Fatalf("first event %+v; want web's request %s, relayed after 2 attempts", e, id(web1))
	}
	if e := next(); e.RequestID != id(web2) {
		t.Fatalf("second event %+v; want web's second request %s (worker's %s is in namespace blog)", e, id(web2), id(wk))
	}
	follow.Process.Signal(syscall.SIGINT)
	if err := follow.Wait(); err != nil {
		t.Errorf("observe --follow after SIGINT: %v (%s)", err, followErr.String())
	}

	// The past, filtered by pod: worker's one request, its reason.
	lines := strings.Split(strings.TrimSpace(egret("observe", "-o", "json", "--pod", "blog/worker")), "\n")
	if len(lines) != 1 {
		t.Fatalf("observe --pod blog/worker: %d lines: %q", len(lines), lines)
	}
	var we proxy.Event
	if err := json.Unmarshal([]byte(lines[0]), &we); err != nil {
		t.Fatal(err)
	}
	if we.RequestID != id(wk) || we.Namespace != "blog" || we.Pod != "worker" || we.Status != 503 || we.Attempts != 1 || we.Reason == "none" {
		t.Fatalf("worker's event: %+v", we)
	}
	t.Logf("worker's request (max_attempts 1 by its override): outcome %s, reason %s", we.Outcome, we.Reason)
	// As a table: a header, then a row per request, newest last.
	table := egret("observe", "-o", "table", "--upstream", up.String())
	rows := strings.Split(strings.TrimSpace(table), "\n")
	if len(rows) != 4 || !strings.HasPrefix(rows[0], "TIME") || !strings.Contains(rows[1], "shop/web") ||
		!strings.Contains(rows[1], id(web1)) || !strings.Contains(rows[2], "blog/worker") || !strings.Contains(rows[3], id(web2)) {
		t.Fatalf("observe -o table:\n%s", table)
	}
	for _, f := range []string{"relayed", "status", "200", "2"} {
		if !slices.Contains(strings.Fields(rows[1]), f) {
			t.Errorf("row of web's first request lacks %q: %s", f, rows[1])
		}
	}
	t.Logf("$ egret observe -o table --upstream %s\n%s", up, table)

	// The effective policy: the worker's override, the node's defaults.
	polOf := func(pod string) agent.PolicyView {
		t.Helper()
		var v agent.PolicyView
		if err := json.Unmarshal([]byte(egret("policy", "-o", "json", "--pod", pod, up.String())), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	field := func(v agent.PolicyView, name string) policy.Field {
		i := slices.IndexFunc(v.Fields, func(f policy.Field) bool { return f.Name == name })
		if i < 0 {
			t.Fatalf("no field %s", name)
		}
		return v.Fields[i]
	}
	wv, webv := polOf("blog/worker"), polOf("web")
	if f := field(wv, "max_attempts"); f.Value != 1.0 || f.From != policy.FromPodDefaults || f.File != "pod blog/worker" {
		t.Errorf("worker's max_attempts: %+v", f)
	}
	if f := field(webv, "max_attempts"); f.Value != 3.0 || f.From != policy.FromBuiltin {
		t.Errorf("web's max_attempts: %+v", f)
	}
	if f := field(webv, "timeout"); f.Value != "5s" || f.From != policy.FromDefaults || f.File != "node.yaml" || f.Line != 2 {
		t.Errorf("web's timeout: %+v", f)
	}
	if webv.Upstream != up.String() || webv.Entry != "defaults" || webv.Dest != up.String() {
		t.Errorf("web's policy for %s: %+v", up, webv)
	}
	pt := egret("policy", "-o", "table", "--pod", "blog/worker", "http://"+up.String()+"/x")
	if !regexpLine(pt, `^max_attempts +1 +pod defaults \(pod blog/worker:2\)$`) {
		t.Errorf("policy -o table:\n%s", pt)
	}
	t.Logf("$ egret policy --pod blog/worker http://%s/x\n%s", up, pt)

	// Status: the agent's summary, version, kernel and eBPF features.
	var st struct {
		Pods    int               `json:"pods"`
		Running int               `json:"running"`
		Version string            `json:"version"`
		Kernel  string            `json:"kernel"`
		EBPF    []bpfload.Feature `json:"ebpf"`
	}
	if err := json.Unmarshal([]byte(egret("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	var u unix.Utsname
	_ = unix.Uname(&u)
	if st.Pods != 2 || st.Running != 2 || st.Version != "e2e-version" || st.Kernel != unix.ByteSliceToString(u.Release[:]) || len(st.EBPF) < 5 {
		t.Fatalf("status: %+v", st)
	}
	for _, f := range st.EBPF {
		// The agent runs: every feature it uses is there.
		if !f.Available {
			t.Errorf("eBPF feature %s reported missing on a kernel that runs the agent: %s", f.Name, f.Error)
		}
	}
	stt := egret("status", "-o", "table")
	if !strings.Contains(stt, "Version:  e2e-version") || !strings.Contains(stt, "BPF_MAP_TYPE_RINGBUF") || !regexpLine(stt, `^running: +2$`) {
		t.Errorf("status -o table:\n%s", stt)
	}
	pt = egret("pods", "-o", "table")
	if !regexpLine(pt, `^blog/worker +running `) || !regexpLine(pt, `^shop/web +running `) {
		t.Errorf("pods -o table:\n%s", pt)
	}
}

// regexpLine reports whether a line of out matches re.
func regexpLine(out, re string) bool {
	return regexp.MustCompile("(?m)" + re).MatchString(out)
}
