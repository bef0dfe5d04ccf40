package kubenode_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/egret-proxy/egret/test/kubenode"
)

// The egret side of TestServices: opted-in clients of the same backend.

// execDir is the node's directory where the backend's replicas record
// the requests they execute (testbin serve -record).
func (c *cluster) execDir() string { return filepath.Join(c.n.Dir, "svc-exec") }

// egretClients creates opted-in client pods and waits until each is
// Ready and behind egret; they are deleted when the test ends.
func (s *service) egretClients(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		s.c.newPod(t, name, []string{"pause"}, optIn)
		t.Cleanup(func() { s.c.deletePod(t, name) })
	}
	full := make([]string, len(names))
	for i, name := range names {
		s.c.n.WaitPod(t, s.c.ns, name, 2*time.Minute, "Ready", kubenode.PodReady)
		full[i] = s.c.ns + "/" + name
	}
	s.c.waitBehindEgret(t, true, 30*time.Second, full...)
}

// spreadAtOnce runs spread -n n in every client pod at the same time and
// adds up their results.
func (s *service) spreadAtOnce(t *testing.T, n int, pods ...string) spreadResult {
	t.Helper()
	start := time.Now()
	outs := make([]string, len(pods))
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, pod := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = s.c.n.KubectlErr("exec", "-n", s.c.ns, pod, "-c", "c", "--", "/testbin", "spread", "-n", fmt.Sprint(n), s.url)
		}()
	}
	wg.Wait()
	sum := spreadResult{ByPod: map[string]int{}, ByStatus: map[string]int{}, ByAttempts: map[string]int{}}
	for i, pod := range pods {
		var r spreadResult
		if errs[i] != nil {
			t.Fatalf("spread in %s: %v\n%s", pod, errs[i], outs[i])
		}
		if err := json.Unmarshal([]byte(outs[i]), &r); err != nil {
			t.Fatalf("spread in %s: %v: %q", pod, err, outs[i])
		}
		t.Logf("%s: by pod %v, by status %v, via egret %d, errors %d", pod, r.ByPod, r.ByStatus, r.ViaEgret, r.Errors)
		sum.Requests += r.Requests
		sum.ViaEgret += r.ViaEgret
		sum.Errors += r.Errors
		sum.Samples = append(sum.Samples, r.Samples...)
		for k, v := range r.ByPod {
			sum.ByPod[k] += v
		}
		for k, v := range r.ByStatus {
			sum.ByStatus[k] += v
		}
		for k, v := range r.ByAttempts {
			sum.ByAttempts[k] += v
		}
	}
	t.Logf("%d GETs from %v at once in %v: by pod %v, by status %v, via egret %d, errors %d",
		sum.Requests, pods, time.Since(start).Round(time.Millisecond), sum.ByPod, sum.ByStatus, sum.ViaEgret, sum.Errors)
	return sum
}

func (s *service) podIP(t testing.TB, name string) string {
	t.Helper()
	p, err := s.c.n.Client.CoreV1().Pods(s.c.ns).Get(s.c.ctx(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Status.PodIP
}

// podConns counts the established TCP connections in the network
// namespace of the pod with address podIP whose peer is dst (IP:port).
// egret dials a Service's endpoints from the pod's own namespace, so its
// pooled connections are there.
func (c *cluster) podConns(t testing.TB, podIP, dst string) int {
	t.Helper()
	script := `for ns in /run/netns/*; do
  if nsenter --net="$ns" ip -4 -o addr 2>/dev/null | grep -q " ` + podIP + `/"; then nsenter --net="$ns" ss -Htn state established; exit; fi
done
echo "no netns with ` + podIP + `" >&2; exit 1`
	out, err := c.n.Command(c.ctx(), "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("sockets of %s: %v: %s", podIP, err, out)
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 4 && f[3] == dst {
			n++
		}
	}
	return n
}

// endpointAddresses lists the addresses in the Service's EndpointSlices.
func (s *service) endpointAddresses(t testing.TB) map[string]bool {
	t.Helper()
	list, err := s.c.n.Client.DiscoveryV1().EndpointSlices(s.c.ns).List(s.c.ctx(), metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + s.name})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, sl := range list.Items {
		for _, e := range sl.Endpoints {
			for _, a := range e.Addresses {
				out[a] = true
			}
		}
	}
	return out
}

// testEndpointLeft takes a replica out of the Service while it keeps
// running and serving (its app label removed: the ReplicaSet lets it go
// and makes another): egret's pooled connections to it are closed, and no
// answer comes from it once it left the EndpointSlice, though it still
// answers whoever dials it.
func (s *service) testEndpointLeft(t *testing.T, client string) {
	// Pools a connection to each endpoint (egret keeps them alive).
	r := s.spread(t, client, 30)
	if r.ViaEgret != 30 {
		t.Fatalf("warm-up: %+v", r)
	}
	victim := s.pods(t)[0]
	vip, cip := s.podIP(t, victim), s.podIP(t, client)
	dst := vip + ":8080"
	if n := s.c.podConns(t, cip, dst); n == 0 {
		t.Fatalf("no pooled connection from %s (%s) to %s after 30 GETs through egret: nothing to show", client, cip, dst)
	} else {
		t.Logf("%d pooled connections from %s to %s (%s)", n, client, victim, dst)
	}
	t.Cleanup(func() { s.c.deletePod(t, victim) })
	start := time.Now()
	s.c.n.Kubectl(t, "label", "pod", "-n", s.c.ns, victim, "app-")
	// Polls the API and the pod's sockets: neither has an event here.
	waitFor(t, 30*time.Second, victim+" out of the EndpointSlices", func() bool { return !s.endpointAddresses(t)[vip] })
	left := time.Since(start)
	waitFor(t, 10*time.Second, "egret's connections to "+dst+" closed", func() bool { return s.c.podConns(t, cip, dst) == 0 })
	closed := time.Since(start)
	r = s.spread(t, client, 60)
	if r.ByPod[victim] != 0 {
		t.Errorf("%d of 60 GETs were answered by %s after it left the EndpointSlice", r.ByPod[victim], victim)
	}
	if r.Requests != 60 || r.ByStatus["200"] != 60 || r.ViaEgret != 60 {
		t.Errorf("after %s left: want 60 answers 200 through egret: %+v", victim, r)
	}
	// It still serves: an answer from it could have come.
	resp, err := s.c.n.HTTPClient(5 * time.Second).Get("http://" + dst + "/")
	if err != nil {
		t.Fatalf("%s no longer serves, so the check shows nothing: %v", victim, err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Served-By"); resp.StatusCode != 200 || got != victim {
		t.Fatalf("%s direct: %s, Served-By %q", dst, resp.Status, got)
	}
	t.Logf("%s left the EndpointSlice %v after its label went; egret's connections to it closed by %v; then 0 of 60 GETs from it (by pod %v), though it still serves",
		victim, left.Round(time.Millisecond), closed.Round(time.Millisecond), r.ByPod)
	s.waitReady(t, 3*time.Minute)
}

// loopPod runs a client pod (opts: optIn) sending a GET and a POST in
// turn, each on a new connection, one every 20 ms (testbin loop -post).
func (s *service) loopPod(t *testing.T, name string, opts ...podOpt) string {
	t.Helper()
	// Ready once its /stats listener is up.
	probe := func(p *corev1.Pod) {
		p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(8080)}},
			PeriodSeconds: 1,
		}
	}
	s.c.newPod(t, name, []string{"loop", "-url", s.url, "-listen", ":8080", "-interval", "20ms", "-post"}, append(opts, probe)...)
	t.Cleanup(func() { s.c.deletePod(t, name) })
	return s.c.n.WaitPod(t, s.c.ns, name, 2*time.Minute, "Ready", kubenode.PodReady).Status.PodIP
}

// restart runs kubectl rollout restart of the backend, waits for the
// rollout and for kube-proxy to have the new replicas only, then for the
// old replicas to be gone, and lets the clients go on for a second.
func (s *service) restart(t *testing.T) {
	t.Helper()
	before := s.pods(t)
	start := time.Now()
	s.c.n.Kubectl(t, "rollout", "restart", "-n", s.c.ns, "deployment/"+s.name)
	s.waitReady(t, 3*time.Minute)
	// Polls until none of the old replicas is left in the API (their
	// stop has no event here), then a second more of requests.
	waitFor(t, time.Minute, "the old replicas gone", func() bool {
		list, err := s.c.n.Client.CoreV1().Pods(s.c.ns).List(s.c.ctx(), metav1.ListOptions{LabelSelector: "app=" + s.name})
		if err != nil {
			return false
		}
		for _, q := range list.Items {
			for _, b := range before {
				if q.Name == b {
					return false
				}
			}
		}
		return true
	})
	time.Sleep(time.Second) // traffic after the rollout, not synchronisation
	t.Logf("rollout restart of %s: %v from the command to the old replicas gone; replicas %v -> %v",
		s.name, time.Since(start).Round(time.Millisecond), before, s.pods(t))
}

// rolloutBoth restarts the backend under two clients at once, one behind
// egret and one not, each sending GETs and POSTs, and checks egret's
// figures: GETs 0 errors, no POST run twice, every POST answered 200,
// not-sent or ambiguous, and truthfully (the replicas' records of what
// they executed). The client without egret's figures are reported.
func (s *service) rolloutBoth(t *testing.T, prefix string) {
	eg := s.loopPod(t, prefix+"-egret", optIn)
	di := s.loopPod(t, prefix+"-direct")
	s.c.waitBehindEgret(t, true, 30*time.Second, s.c.ns+"/"+prefix+"-egret")
	s.c.waitLoopViaEgret(t, eg, time.Now(), 30*time.Second)
	// The clients' first requests are not the rollout's.
	s.c.loop(t, eg, "reset")
	s.c.loop(t, di, "reset")
	s.restart(t)
	se, sd := s.c.loop(t, eg, "stats"), s.c.loop(t, di, "stats")
	exec := s.executions(t)
	pe, pd := checkPosts(se.Posts, exec), checkPosts(sd.Posts, exec)
	for _, x := range []struct {
		who string
		st  loopStats
		p   postReport
	}{{"through egret", se, pe}, {"without egret", sd, pd}} {
		t.Logf("%s (%s backends): GETs %d (via egret %d): %d failed connects, %d failed requests, %d hung, %d not 200, slowest %.0f ms; POSTs %d: answers %v, executed of each %v, run twice %d, untrue %d, slowest %.0f ms; errors %q %q",
			x.who, prefix, x.st.Requests, x.st.ViaEgret, x.st.FailedConnects, x.st.FailedRequests, x.st.Hung, x.st.BadStatus, x.st.SlowestMS,
			x.p.Requests, x.p.Answers, x.p.Executed, len(x.p.Twice), len(x.p.Untrue), x.p.Slowest, x.st.Errors, x.p.Errors)
	}
	if se.Requests < 50 || pe.Requests < 50 {
		t.Errorf("through egret: %d GETs and %d POSTs during the rollout, want at least 50 of each", se.Requests, pe.Requests)
	}
	if se.FailedConnects+se.FailedRequests+se.Hung+se.BadStatus != 0 || se.ViaEgret != se.Requests {
		t.Errorf("through egret: want every GET answered 200 through egret: %+v", se)
	}
	if len(pe.Twice) != 0 {
		t.Errorf("through egret: POSTs run twice: %v", pe.Twice)
	}
	if len(pe.Untrue) != 0 {
		t.Errorf("through egret: answers the executions contradict: %v", pe.Untrue)
	}
	for a, n := range pe.Answers {
		if a != "200" && !strings.HasSuffix(a, " not-sent") && !strings.HasSuffix(a, " ambiguous") {
			t.Errorf("through egret: %d POSTs answered %q, want 200, not-sent or ambiguous", n, a)
		}
	}
}

// executions reads the replicas' records: how many times each Exec-Id ran.
func (s *service) executions(t testing.TB) map[string]int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(s.c.execDir(), "*"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if id := strings.TrimSpace(sc.Text()); id != "" {
				out[id]++
			}
		}
		f.Close()
	}
	return out
}

// postReport compares a client's POST answers with the executions.
type postReport struct {
	Requests int
	Answers  map[string]int
	// Executed counts, per answer, the POSTs that ran.
	Executed map[string]int
	// Twice are the POSTs that ran more than once; Untrue those whose
	// answer the executions contradict (200 or failed: it ran once;
	// not-sent: it did not run; ambiguous: either).
	Twice, Untrue []string
	Errors        []string
	Slowest       float64 // ms
}

func checkPosts(p *loopPosts, exec map[string]int) postReport {
	r := postReport{Answers: map[string]int{}, Executed: map[string]int{}}
	if p == nil {
		return r
	}
	r.Requests, r.Errors, r.Slowest = p.Requests, p.Errors, p.SlowestMS
	ids := make([]string, 0, len(p.ByID))
	for id := range p.ByID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		a, n := p.ByID[id], exec[id]
		r.Answers[a]++
		if n > 0 {
			r.Executed[a]++
		}
		if n > 1 {
			r.Twice = append(r.Twice, fmt.Sprintf("%s (%s) ran %d times", id, a, n))
		}
		want := -1 // any
		switch {
		case a == "200", strings.HasSuffix(a, " failed"):
			want = 1
		case strings.HasSuffix(a, " not-sent"):
			want = 0
		}
		if want >= 0 && n != want {
			r.Untrue = append(r.Untrue, fmt.Sprintf("%s answered %q ran %d times", id, a, n))
		}
	}
	return r
}

// testMetricsBounded scrapes the agent's /metrics after all of the
// above (6 replicas come and gone, a replica taken out): the backend is
// one upstream label value, namespace/name:port, and no series names an
// endpoint.
func (s *service) testMetricsBounded(t *testing.T) {
	body := s.c.agentMetrics(t)
	label := regexp.MustCompile(`="([^"]*` + regexp.QuoteMeta(s.c.ns+"/"+s.name) + `[^"]*)"`)
	values := map[string]int{}
	series := 0
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "#") || l == "" {
			continue
		}
		if m := label.FindStringSubmatch(l); m != nil {
			values[m[1]]++
			series++
		}
		for ip := range s.seen {
			if strings.Contains(l, `"`+ip+`:`) || strings.Contains(l, `"`+ip+`"`) {
				t.Errorf("a series names the endpoint %s: %s", ip, l)
			}
		}
	}
	t.Logf("/metrics: %d series name the Service, label values %v; %d endpoint addresses seen in the test, none in a series", series, values, len(s.seen))
	want := s.c.ns + "/" + s.name + ":80"
	if len(values) != 1 || values[want] == 0 {
		t.Errorf("want one label value for the Service, %q: %v", want, values)
	}
}
