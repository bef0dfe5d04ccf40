package kubenode_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/test/kubenode"
	"github.com/egret-proxy/egret/test/ledger"
)

const (
	egretImage = "ghcr.io/egret-proxy/egret:0.1.0"
	egretNS    = "egret-system"
	ledgerPort = "18080"
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// cluster is the node with egret installed and the ledger upstream on
// the node's address.
type cluster struct {
	n      *kubenode.Node
	led    *ledger.Server
	ledURL string
	ns     string // the tests' namespace
}

// startCluster starts a node with a namespace ns whose default
// ServiceAccount exists, and, withLedger, the ledger serving on the node's
// address (c.ledURL).
func startCluster(t *testing.T, ns string, withLedger bool) *cluster {
	t.Helper()
	n := kubenode.Start(t)
	c := &cluster{n: n, ns: ns}
	if withLedger {
		c.led = ledger.New()
		if _, err := c.led.Serve(n.Listen(t, kubenode.IP+":"+ledgerPort)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.led.Close() })
		c.ledURL = "http://" + kubenode.IP + ":" + ledgerPort
	}
	n.Kubectl(t, "create", "namespace", c.ns)
	waitFor(t, 30*time.Second, "the test namespace's default ServiceAccount", func() bool {
		_, err := n.Client.CoreV1().ServiceAccounts(c.ns).Get(c.ctx(), "default", metav1.GetOptions{})
		return err == nil
	})
	return c
}

func (c *cluster) ctx() context.Context { return context.Background() }

// agentPod returns the running agent pod (not being deleted).
func (c *cluster) agentPod(t testing.TB) *corev1.Pod {
	t.Helper()
	list, err := c.n.Client.CoreV1().Pods(egretNS).List(c.ctx(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=egret"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil {
			return &list.Items[i]
		}
	}
	return nil
}

// waitAgentReady waits for an agent pod that is Ready and satisfies ok
// (nil: any), and returns it.
func (c *cluster) waitAgentReady(t testing.TB, timeout time.Duration, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last, ready *corev1.Pod
	// Polls a real node (API server, pods, kernel), whose changes reach
	// no event here.
	if testenv.Poll(timeout, func() bool {
		p := c.agentPod(t)
		if p != nil {
			last = p
			if kubenode.PodReady(p) && (ok == nil || ok(p)) {
				ready = p
			}
		}
		return ready != nil
	}) {
		return ready
	}
	msg := "none"
	if last != nil {
		b, _ := json.Marshal(last.Status)
		msg = string(b) + "\nlog:\n" + tailLines(c.n.ContainerLog(egretNS, last.Name, "agent"), 30)
	}
	t.Fatalf("no Ready egret agent after %v; last: %s", timeout, msg)
	return nil
}

func tailLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// adminPath is the agent pod's admin socket, as the node sees it (an
// emptyDir the kubelet mounted in the node's mount namespace).
func (c *cluster) adminPath(p *corev1.Pod) string {
	return filepath.Join(c.n.Root(), c.n.Dir, "var", "kubelet", "pods", string(p.UID), "volumes", "kubernetes.io~empty-dir", "run", "agent.sock")
}

// adminGet asks the agent's admin API for path and returns its answer.
func (c *cluster) adminGet(p *corev1.Pod, path string) ([]byte, error) {
	// The socket's path is longer than a unix address may be: reach it
	// through a descriptor of its directory.
	dir, err := os.Open(filepath.Dir(c.adminPath(p)))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	hc := agent.AdminClient(fmt.Sprintf("/proc/self/fd/%d/agent.sock", dir.Fd()))
	hc.Timeout = 5 * time.Second
	defer hc.CloseIdleConnections() // one connection per call, closed: the agent's descriptors are counted
	resp, err := hc.Get("http://egret" + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("admin API %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return b, err
}

// agentPods asks the agent's admin API for its pods.
func (c *cluster) agentPods(t testing.TB, p *corev1.Pod) (map[string]agent.PodStatus, error) {
	t.Helper()
	b, err := c.adminGet(p, "/pods")
	if err != nil {
		return nil, err
	}
	var list []agent.PodStatus
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, err
	}
	out := map[string]agent.PodStatus{}
	for _, s := range list {
		out[s.Name] = s
	}
	return out, nil
}

// agentMetrics is the agent's /metrics, as Prometheus scrapes it.
func (c *cluster) agentMetrics(t testing.TB) []byte {
	t.Helper()
	ap := c.agentPod(t)
	resp, err := c.n.HTTPClient(5 * time.Second).Get("http://" + ap.Status.PodIP + ":9090/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %v %s", err, resp.Status)
	}
	return body
}

// waitBehindEgret polls the agent's admin API (it has no stream of
// changes to wait on) until the agent lists every named pod
// (namespace/name) running (want true) or lists none of them (false).
func (c *cluster) waitBehindEgret(t testing.TB, want bool, timeout time.Duration, names ...string) {
	t.Helper()
	var last map[string]agent.PodStatus
	var lastErr error
	if testenv.Poll(timeout, func() bool {
		ap := c.agentPod(t)
		if ap == nil {
			return false
		}
		if last, lastErr = c.agentPods(t, ap); lastErr != nil {
			return false
		}
		for _, n := range names {
			s, ok := last[n]
			if want != (ok && s.State == agent.StateRunning) || (!want && ok) {
				return false
			}
		}
		return true
	}) {
		return
	}
	t.Fatalf("pods %v behind egret = %v not reached in %v; agent has %d pods (%v)", names, want, timeout, len(last), lastErr)
}

type podOpt func(*corev1.Pod)

func optIn(p *corev1.Pod) {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations["egret.dev/enabled"] = "true"
}

// newPod creates a pod running /testbin args in the test namespace.
func (c *cluster) newPod(t testing.TB, name string, args []string, opts ...podOpt) *corev1.Pod {
	t.Helper()
	zero := int64(1)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns, Labels: map[string]string{"test": "kubenode"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name: "c", Image: kubenode.ToolsImage, ImagePullPolicy: corev1.PullNever,
				Command: append([]string{"/testbin"}, args...),
			}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	got, err := c.n.Client.CoreV1().Pods(c.ns).Create(c.ctx(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	return got
}

func (c *cluster) deletePod(t testing.TB, name string) {
	t.Helper()
	err := c.n.Client.CoreV1().Pods(c.ns).Delete(c.ctx(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	c.n.WaitPod(t, c.ns, name, 60*time.Second, "gone", func(p *corev1.Pod) bool { return p == nil })
}

// exec runs /testbin args in the pod's container c (kubectl exec: the
// process joins the container's cgroup and namespaces).
func (c *cluster) exec(t testing.TB, pod string, args ...string) string {
	t.Helper()
	out, err := c.n.KubectlErr(append([]string{"exec", "-n", c.ns, pod, "-c", "c", "--", "/testbin"}, args...)...)
	if err != nil {
		t.Fatalf("exec in %s: %v\n%s", pod, err, out)
	}
	return out
}

// response is what testbin get printed.
type response struct {
	status  string
	headers map[string]string
	body    string
}

func parseResponse(t testing.TB, out string) response {
	t.Helper()
	r := response{headers: map[string]string{}}
	sc := bufio.NewScanner(strings.NewReader(out))
	if !sc.Scan() {
		t.Fatalf("no response: %q", out)
	}
	r.status = sc.Text()
	for sc.Scan() && sc.Text() != "" {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		r.headers[k] = v
	}
	var b strings.Builder
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	r.body = b.String()
	return r
}

// get asks the ledger from a pod, with a 503 the first time: through
// egret it comes back 200 after 2 attempts; direct it is the 503.
func (c *cluster) get503Once(t testing.TB, pod, id string) response {
	t.Helper()
	return parseResponse(t, c.exec(t, pod, "get", c.ledURL+"/hello", "Ledger-Id: "+id, "Ledger-Fault: 503; times=1"))
}

func (c *cluster) expectRetried(t testing.TB, pod string) response {
	t.Helper()
	id := kubenode.RandName(pod + "-")
	r := c.get503Once(t, pod, id)
	if !strings.Contains(r.status, "200") || r.headers["Egret-Attempts"] != "2" {
		// What egret and the ledger saw of it, for the cause.
		var said []string
		explained := "(no Egret-Request-Id)"
		if rid := r.headers["Egret-Request-Id"]; rid != "" {
			ap := c.agentPod(t)
			for _, line := range strings.Split(c.n.ContainerLog(egretNS, ap.Name, "agent"), "\n") {
				if strings.Contains(line, rid) {
					said = append(said, line)
				}
			}
			b, err := c.adminGet(ap, "/explain/"+rid)
			explained = string(b)
			if err != nil {
				explained = err.Error()
			}
		}
		diag := ""
		if strings.Contains(explained, "connect_timeout") {
			p, err := c.n.Client.CoreV1().Pods(c.ns).Get(c.ctx(), pod, metav1.GetOptions{})
			if err == nil {
				diag = c.netDiag(p.Status.PodIP)
			}
		}
		t.Fatalf("from %s: %s, Egret-Attempts %q; want 200 after 2 attempts through egret (headers %v; body %q; ledger executions %d; agent log %q; explain %s)%s",
			pod, r.status, r.headers["Egret-Attempts"], r.headers, r.body, c.led.Executions(id), said, explained, diag)
	}
	if n := c.led.Executions(id); n != 2 {
		t.Fatalf("ledger executed %s %d times, want 2", id, n)
	}
	return r
}

func (c *cluster) expectDirect(t testing.TB, pod string) {
	t.Helper()
	id := kubenode.RandName(pod + "-")
	r := c.get503Once(t, pod, id)
	if !strings.Contains(r.status, "503") || r.headers["Egret-Attempts"] != "" {
		t.Fatalf("from %s: %s, Egret-Attempts %q; want the upstream's own 503, direct", pod, r.status, r.headers["Egret-Attempts"])
	}
}

// loopStats are testbin loop's counts.
type loopStats struct {
	Requests       int      `json:"requests"`
	ViaEgret       int      `json:"via_egret"`
	Direct         int      `json:"direct"`
	FailedConnects int      `json:"failed_connects"`
	FailedRequests int      `json:"failed_requests"`
	Hung           int      `json:"hung"`
	BadStatus      int      `json:"bad_status"`
	Errors         []string `json:"errors"`
	DirectRuns     []struct {
		Requests int     `json:"requests"`
		GapMS    float64 `json:"gap_ms"`
	} `json:"direct_runs"`
	LastEgret time.Time  `json:"last_egret"`
	Posts     *loopPosts `json:"posts"`
	SlowestMS float64    `json:"slowest_ms"`
}

// loopPosts are testbin loop -post's POST answers.
type loopPosts struct {
	Requests int               `json:"requests"`
	Answers  map[string]int    `json:"answers"`
	ByID     map[string]string `json:"by_id"`
	Errors   []string          `json:"errors"`
	// SlowestMS: the longest POST in ms.
	SlowestMS float64 `json:"slowest_ms"`
}

func (c *cluster) loop(t testing.TB, podIP, what string) loopStats {
	t.Helper()
	resp, err := c.n.HTTPClient(5 * time.Second).Get("http://" + podIP + ":8080/" + what)
	if err != nil {
		t.Fatalf("loop %s: %v", what, err)
	}
	defer resp.Body.Close()
	var s loopStats
	if what == "stats" {
		if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
			t.Fatal(err)
		}
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	return s
}

// waitLoopViaEgret polls the loop's stats (it has no stream of changes to
// wait on) until its answers come through egret
// again (after since).
func (c *cluster) waitLoopViaEgret(t testing.TB, podIP string, since time.Time, timeout time.Duration) loopStats {
	t.Helper()
	var s loopStats
	if !testenv.Poll(timeout, func() bool { s = c.loop(t, podIP, "stats"); return s.LastEgret.After(since) }) {
		t.Fatalf("the loop's requests did not come through egret again within %v: %+v", timeout, s)
	}
	return s
}

// agentLog returns the agent pod's log lines (JSON) with msg.
func (c *cluster) agentLogLines(p *corev1.Pod, msg string) []map[string]any {
	return logLines(c.n.ContainerLog(egretNS, p.Name, "agent"), msg)
}

// logLines returns the lines of a JSON log with msg.
func logLines(log, msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(log, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// events returns the Events on a pod with reason.
func (c *cluster) events(t testing.TB, ns, pod, reason string) []corev1.Event {
	t.Helper()
	list, err := c.n.Client.CoreV1().Events(ns).List(c.ctx(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func waitFor(t testing.TB, timeout time.Duration, what string, f func() bool) {
	t.Helper()
	// Polls a real node (API server, pods, kernel), whose changes reach
	// no event here.
	testenv.Eventually(t, timeout, what, f)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

var _ = fmt.Sprintf
var _ http.Header

// netDiag is the state of the node's and a pod's network stacks, for a
// failure that looks like the network's: sockets with their timers, the
// TCP counters, the pod's neighbours and the node's packet filter.
func (c *cluster) netDiag(podIP string) string {
	script := `
for ns in /run/netns/*; do
  if nsenter --net="$ns" ip -4 -o addr 2>/dev/null | grep -q " ` + podIP + `/"; then pod=$ns; fi
done
echo "== pod ` + podIP + ` netns $pod: ss"; nsenter --net="$pod" ss -tanoie
echo "== pod: ip neigh"; nsenter --net="$pod" ip neigh
echo "== pod: ip rule, route"; nsenter --net="$pod" ip rule; nsenter --net="$pod" ip route
echo "== pod: nstat"; nsenter --net="$pod" nstat -asz | grep -E -i 'Syn|Drop|Retrans|Reset|Timeout|Attempt|Overflow|Outs|InErrs|OutRsts'
echo "== node: ss"; ss -tanoi
echo "== node: nstat"; nstat -asz | grep -E -i 'Syn|Drop|Retrans|Reset|Timeout|Overflow|InErrs|OutRsts'
echo "== node: iptables"; iptables-save -c 2>&1 | grep -v '^\[0:0\]' | head -80
echo "== node: nft"; nft list ruleset 2>&1 | head -80
echo "== node: conntrack"; grep -F ` + podIP + ` /proc/net/nf_conntrack 2>&1 | head -40
`
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := c.n.Command(ctx, "sh", "-c", script).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s\n(netDiag: %v)", out, err)
	}
	return string(out)
}
