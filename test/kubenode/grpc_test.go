package kubenode_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/test/kubenode"
)

// grpcRoutes is the idem client's policy override (its egret.dev/policy
// annotation): every method of grpc.testing.TestService is idempotent, so
// a Trailers-Only UNAVAILABLE is retried as a 503 is.
const grpcRoutes = `defaults:
  routes:
    - {method: POST, path_prefix: /grpc.testing.TestService/, idempotent: true}
`

// TestGRPCOnNode: opted-in pods call a gRPC Service (ClusterIP, 3
// replicas of grpc-go's own server) with grpc-go's client, by its cluster
// DNS name, every call of a run a stream of one client connection.
// Through egret: the calls are served as HTTP/2 (the agent's
// egret_proxy_h2_connections_total rises by one per client connection),
// each answer carries egret-attempts and egret-request-id; a
// Trailers-Only UNAVAILABLE is retried for the pod whose policy declares
// the service idempotent and passed on for the pod whose policy does not;
// a call whose stream the server reset after reading it is answered
// UNKNOWN with egret-outcome ambiguous. The replicas record what they
// execute: no call ran twice, and each answer is true to the records.
func TestGRPCOnNode(t *testing.T) {
	start := time.Now()
	c := startCluster(t, "egret-grpc", false)
	b := c.newGRPCBackend(t, "grpc", 3)
	c.installEgret(t)
	// idem declares the TestService idempotent; plain has the node's
	// policy (a gRPC call is a POST: not idempotent).
	c.newPod(t, "idem", []string{"pause"}, optIn, func(p *corev1.Pod) { p.Annotations["egret.dev/policy"] = grpcRoutes })
	c.newPod(t, "plain", []string{"pause"}, optIn)
	for _, name := range []string{"idem", "plain"} {
		t.Cleanup(func() { c.deletePod(t, name) })
	}
	for _, name := range []string{"idem", "plain"} {
		c.n.WaitPod(t, c.ns, name, 2*time.Minute, "Ready", kubenode.PodReady)
	}
	c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/idem", c.ns+"/plain")
	b.waitReady(t, 3*time.Minute)
	t.Logf("setup: node, egret, 3 gRPC replicas Ready and in kube-proxy's rules, two opted-in clients, in %v", time.Since(start).Round(time.Millisecond))

	t.Run("ManyStreamsOneConnection", func(t *testing.T) {
		const n = 200
		r := b.call(t, "plain", "-n", strconv.Itoa(n), "-c", "20", "-id", "many", b.target())
		exec := b.executions(t)
		byPod := map[string]int{}
		for _, x := range r.Calls {
			if x.Code != "OK" || !x.Intact || x.Attempts != "1" || x.In != "header" || x.RequestID == "" {
				t.Errorf("%s: %+v, want OK with its own payload back, egret-attempts 1 and egret-request-id in the header", x.ID, x)
			}
			if exec[x.ID] != 1 {
				t.Errorf("%s ran %d times, want once", x.ID, exec[x.ID])
			}
			byPod[x.ServedBy]++
		}
		b.requireDistinctIDs(t, r)
		if r.h2Conns != 1 {
			t.Errorf("egret_proxy_h2_connections_total rose by %d for one client connection, want 1", r.h2Conns)
		}
		pods := b.pods(t)
		for _, p := range pods {
			if byPod[p] < n/10 {
				t.Errorf("replica %s served %d of %d calls, want at least %d: %v", p, byPod[p], n, n/10, byPod)
			}
		}
		if len(byPod) != len(pods) {
			t.Errorf("calls served by %v; the replicas are %v", byPod, pods)
		}
		t.Logf("%d unary calls, 20 at a time, on one client connection (%d h2 connection at egret): %v; served by %v; slowest %.1f ms; all in %.0f ms",
			n, r.h2Conns, r.ByCode, byPod, r.slowest(), r.MS)
	})

	t.Run("ServerStreaming", func(t *testing.T) {
		r := b.call(t, "plain", "-n", "10", "-c", "5", "-method", "stream", "-id", "stream", b.target())
		exec := b.executions(t)
		for _, x := range r.Calls {
			if x.Code != "OK" || !x.Intact || x.Messages != 5 || x.Attempts != "1" || x.In != "header" || x.RequestID == "" {
				t.Errorf("%s: %+v, want OK, 5 messages of 16 KiB intact, egret-attempts 1 in the header", x.ID, x)
			}
			if exec[x.ID] != 1 {
				t.Errorf("%s ran %d times, want once", x.ID, exec[x.ID])
			}
		}
		t.Logf("10 server-streaming calls (5 × 16 KiB each): %v, h2 connections +%d, slowest %.1f ms", r.ByCode, r.h2Conns, r.slowest())
	})

	t.Run("UnavailableRetriedWhenIdempotent", func(t *testing.T) {
		const n = 30
		r := b.call(t, "idem", "-n", strconv.Itoa(n), "-c", "5", "-fault", "unavailable-once", "-id", "idem", b.target())
		exec, refused := b.executions(t), b.refusedBy(t)
		elsewhere := 0
		for _, x := range r.Calls {
			if x.Code != "OK" || !x.Intact || x.Attempts != "2" || x.In != "header" || x.RequestID == "" {
				t.Errorf("%s: %+v, want OK after egret's second attempt (egret-attempts 2)", x.ID, x)
			}
			if refused[x.ID] == "" {
				t.Errorf("%s: no replica answered it UNAVAILABLE first", x.ID)
			}
			if exec[x.ID] != 1 {
				t.Errorf("%s ran %d times, want once (the UNAVAILABLE attempt did not run it)", x.ID, exec[x.ID])
			}
			if x.ServedBy != "" && x.ServedBy != refused[x.ID] {
				elsewhere++
			}
		}
		b.requireDistinctIDs(t, r)
		// What egret says of one of them: two attempts, from the pod.
		x := r.Calls[0]
		tv := b.explain(t, x.RequestID)
		if len(tv.Attempts) != 2 || tv.Pod != c.ns+"/idem" || tv.Outcome != "relayed" || !tv.Idempotent {
			t.Errorf("explain %s (%s): %d attempts, pod %q, outcome %q; want 2, %s/idem, relayed, idempotent: %+v", x.RequestID, x.ID, len(tv.Attempts), tv.Pod, tv.Outcome, c.ns, tv)
		}
		t.Logf("%d calls answered UNAVAILABLE (Trailers-Only) once, method declared idempotent: %v, egret-attempts %v; %d of them retried on another replica; explain %s: %d attempts %v",
			n, r.ByCode, r.attempts(), elsewhere, x.RequestID, len(tv.Attempts), decisions(tv))
	})

	t.Run("UnavailablePassedOnWhenNotDeclared", func(t *testing.T) {
		r := b.call(t, "plain", "-n", "5", "-fault", "unavailable-once", "-id", "plain", b.target())
		exec, refused := b.executions(t), b.refusedBy(t)
		for _, x := range r.Calls {
			// The server's own answer, relayed: egret does not retry a
			// POST that got one (gRPC: an RPC is committed once response
			// headers arrive).
			if x.Code != "Unavailable" || !strings.Contains(x.Message, "unavailable, once") || x.Attempts != "1" || x.Outcome != "" || x.RequestID == "" || x.In != "trailer" {
				t.Errorf("%s: %+v, want the server's UNAVAILABLE, still Trailers-Only (egret's fields in the trailer), with egret-attempts 1", x.ID, x)
			}
			if refused[x.ID] == "" || exec[x.ID] != 0 {
				t.Errorf("%s: refused by %q, ran %d times; want refused once and never run", x.ID, refused[x.ID], exec[x.ID])
			}
		}
		t.Logf("5 calls answered UNAVAILABLE once, method not declared idempotent: %v, egret-attempts %v, in the %s", r.ByCode, r.attempts(), r.Calls[0].In)
	})

	t.Run("ResetAfterReadAmbiguous", func(t *testing.T) {
		r := b.call(t, "plain", "-n", "5", "-id", "reset", b.resetTarget())
		exec := b.executions(t)
		for _, x := range r.Calls {
			if x.Code != "Unknown" || x.Outcome != "ambiguous" || x.Attempts != "1" || x.RequestID == "" || x.In != "trailer" ||
				!strings.Contains(x.Message, "may have been executed") {
				t.Errorf("%s: %+v, want Trailers-Only UNKNOWN with egret-outcome ambiguous after one attempt, saying it may have run", x.ID, x)
			}
			if exec[x.ID] != 1 {
				t.Errorf("%s ran %d times, want once (read, then its stream reset)", x.ID, exec[x.ID])
			}
		}
		x := r.Calls[0]
		tv := b.explain(t, x.RequestID)
		if tv.Outcome != "ambiguous" || len(tv.Attempts) != 1 || tv.Attempts[0].Evidence != engine.SentNoResponse.String() {
			t.Errorf("explain %s: outcome %q, attempts %v; want ambiguous after one attempt, sent_no_response: %+v", x.RequestID, tv.Outcome, decisions(tv), tv)
		}
		t.Logf("5 calls whose stream the server reset after reading (and running) them: %v, egret-outcome %q in the %s, message %q; explain: %v",
			r.ByCode, x.Outcome, x.In, x.Message, decisions(tv))
	})

	t.Run("NoCallRanTwice", func(t *testing.T) {
		exec := b.executions(t)
		twice := 0
		for id, k := range exec {
			if k > 1 {
				twice++
				t.Errorf("%s ran %d times", id, k)
			}
		}
		t.Logf("%d calls executed in all, %d more than once", len(exec), twice)
	})
	t.Logf("TestGRPCOnNode took %v", time.Since(start).Round(time.Millisecond))
}

// grpcBackend is a Deployment of testbin grpc-serve behind a ClusterIP
// Service: port grpc (50051, grpc-go's server) and port reset (50052,
// the h2c server that resets each stream after reading it).
type grpcBackend struct {
	c        *cluster
	name     string
	replicas int
}

func (c *cluster) grpcExecDir() string { return filepath.Join(c.n.Dir, "grpc-exec") }

// newGRPCBackend creates the Deployment and the Service; waitReady waits
// for them.
func (c *cluster) newGRPCBackend(t testing.TB, name string, replicas int) *grpcBackend {
	t.Helper()
	if err := os.MkdirAll(c.grpcExecDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	n := int32(replicas)
	grace := int64(1)
	labels := map[string]string{"app": name}
	dirType := corev1.HostPathDirectory
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &grace,
					Volumes: []corev1.Volume{{Name: "exec", VolumeSource: corev1.VolumeSource{
						HostPath: &corev1.HostPathVolumeSource{Path: c.grpcExecDir(), Type: &dirType}}}},
					Containers: []corev1.Container{{
						Name: "c", Image: kubenode.ToolsImage, ImagePullPolicy: corev1.PullNever,
						Command:      []string{"/testbin", "grpc-serve", "-listen", ":50051", "-reset-listen", ":50052", "-record", "/exec"},
						VolumeMounts: []corev1.VolumeMount{{Name: "exec", MountPath: "/exec"}},
						Ports: []corev1.ContainerPort{
							{Name: "grpc", ContainerPort: 50051},
							{Name: "reset", ContainerPort: 50052},
						},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(50051)}},
							PeriodSeconds: 1,
						},
					}},
				},
			},
		},
	}
	if _, err := c.n.Client.AppsV1().Deployments(c.ns).Create(c.ctx(), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports: []corev1.ServicePort{
				{Name: "grpc", Port: 50051, TargetPort: intstr.FromString("grpc")},
				{Name: "reset", Port: 50052, TargetPort: intstr.FromString("reset")},
			},
		},
	}
	if _, err := c.n.Client.CoreV1().Services(c.ns).Create(c.ctx(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &grpcBackend{c: c, name: name, replicas: replicas}
}

func (b *grpcBackend) target() string {
	return kubenode.ServiceHost(b.c.ns, b.name) + ":50051"
}

func (b *grpcBackend) resetTarget() string {
	return kubenode.ServiceHost(b.c.ns, b.name) + ":50052"
}

// waitReady waits for the rollout and for kube-proxy's rules to send each
// of the Service's ports to every replica.
func (b *grpcBackend) waitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	if out, err := b.c.n.KubectlErr("rollout", "status", "-n", b.c.ns, "deployment/"+b.name, "--timeout", timeout.String()); err != nil {
		t.Fatalf("rollout status: %v\n%s\npods:\n%s", err, out, b.c.n.Kubectl(t, "get", "pods", "-n", b.c.ns, "-o", "wide"))
	}
	waitFor(t, 30*time.Second, fmt.Sprintf("kube-proxy's rules for %s/%s with %d endpoints per port", b.c.ns, b.name, b.replicas), func() bool {
		out, err := b.c.n.Command(b.c.ctx(), "iptables-save", "-t", "nat").Output()
		if err != nil {
			t.Fatalf("iptables-save in the node: %v", err)
		}
		for _, port := range []string{"grpc", "reset"} {
			comment := fmt.Sprintf("%s/%s:%s", b.c.ns, b.name, port)
			k := 0
			for _, l := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(l, "-A KUBE-SVC-") && strings.Contains(l, comment) && strings.Contains(l, "-j KUBE-SEP-") {
					k++
				}
			}
			if k != b.replicas {
				return false
			}
		}
		return true
	})
}

// pods lists the Ready replicas' names (sorted).
func (b *grpcBackend) pods(t testing.TB) []string {
	t.Helper()
	list, err := b.c.n.Client.CoreV1().Pods(b.c.ns).List(b.c.ctx(), metav1.ListOptions{LabelSelector: "app=" + b.name})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && kubenode.PodReady(&p) {
			out = append(out, p.Name)
		}
	}
	sort.Strings(out)
	return out
}

// grpcRun is what testbin grpc-call printed, and by how much the agent's
// egret_proxy_h2_connections_total rose over it.
type grpcRun struct {
	Calls []struct {
		ID        string  `json:"id"`
		Code      string  `json:"code"`
		Message   string  `json:"message"`
		Attempts  string  `json:"attempts"`
		RequestID string  `json:"request_id"`
		Outcome   string  `json:"outcome"`
		In        string  `json:"in"`
		ServedBy  string  `json:"served_by"`
		Messages  int     `json:"messages"`
		Intact    bool    `json:"intact"`
		MS        float64 `json:"ms"`
	} `json:"calls"`
	ByCode  map[string]int `json:"by_code"`
	MS      float64        `json:"ms"`
	h2Conns int
}

func (r grpcRun) slowest() float64 {
	m := 0.0
	for _, x := range r.Calls {
		m = max(m, x.MS)
	}
	return m
}

// attempts counts the calls by egret-attempts.
func (r grpcRun) attempts() map[string]int {
	out := map[string]int{}
	for _, x := range r.Calls {
		out[x.Attempts]++
	}
	return out
}

// call runs testbin grpc-call in the pod (kubectl exec: in the pod's
// cgroup and network namespace, so behind egret when the pod is).
func (b *grpcBackend) call(t testing.TB, pod string, args ...string) grpcRun {
	t.Helper()
	before := b.h2Conns(t)
	out := b.c.exec(t, pod, append([]string{"grpc-call"}, args...)...)
	var r grpcRun
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("grpc-call: %v: %q", err, out)
	}
	r.h2Conns = b.h2Conns(t) - before
	return r
}

func (b *grpcBackend) requireDistinctIDs(t testing.TB, r grpcRun) {
	t.Helper()
	seen := map[string]string{}
	for _, x := range r.Calls {
		if prev, ok := seen[x.RequestID]; ok && x.RequestID != "" {
			t.Errorf("%s and %s have the same egret-request-id %s", prev, x.ID, x.RequestID)
		}
		seen[x.RequestID] = x.ID
	}
}

// h2Conns reads the agent's egret_proxy_h2_connections_total.
func (b *grpcBackend) h2Conns(t testing.TB) int {
	t.Helper()
	const name = "egret_proxy_h2_connections_total"
	for _, l := range strings.Split(string(b.c.agentMetrics(t)), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return int(v)
		}
	}
	t.Fatalf("the agent's /metrics has no %s", name)
	return 0
}

// executions reads the replicas' records: how many times each exec-id ran.
func (b *grpcBackend) executions(t testing.TB) map[string]int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(b.c.grpcExecDir(), "*"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, name := range files {
		if fi, err := os.Stat(name); err != nil || fi.IsDir() {
			continue
		}
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range strings.Fields(string(data)) {
			out[id]++
		}
	}
	return out
}

// refusedBy maps each exec-id whose first attempt was answered
// UNAVAILABLE (fault unavailable-once) to the replica that answered it.
func (b *grpcBackend) refusedBy(t testing.TB) map[string]string {
	t.Helper()
	dir := filepath.Join(b.c.grpcExecDir(), "once")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = strings.TrimSpace(string(data))
	}
	return out
}

// decisions says what each attempt of a trace came to.
func decisions(tv agent.TraceView) []string {
	var out []string
	for _, a := range tv.Attempts {
		out = append(out, fmt.Sprintf("#%d to %s: status %d, failure %s, evidence %s: %s (%s)", a.N, a.Endpoint, a.Status, a.Failure, a.Evidence, a.Decision, a.Reason))
	}
	return out
}

// explain asks the agent's admin API what became of a request.
func (b *grpcBackend) explain(t testing.TB, id string) agent.TraceView {
	t.Helper()
	data, err := b.c.adminGet(b.c.agentPod(t), "/explain/"+id)
	if err != nil {
		t.Fatalf("explain %s: %v", id, err)
	}
	var tv agent.TraceView
	if err := json.Unmarshal(data, &tv); err != nil {
		t.Fatalf("explain %s: %v: %s", id, err, data)
	}
	return tv
}
