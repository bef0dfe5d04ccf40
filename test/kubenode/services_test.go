package kubenode_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/egret-proxy/egret/test/kubenode"
)

// TestServices: the node's Service path as workloads use it. A 3-replica
// backend Deployment behind a ClusterIP Service; client pods call it by
// its cluster DNS name (CoreDNS behind kube-dns, kube-proxy in iptables
// mode). One node serves both sides: first a client without egret
// (kube-proxy alone), then egret installed from deploy/kubernetes and
// opted-in clients beside clients that are not.
func TestServices(t *testing.T) {
	start := time.Now()
	c := startCluster(t, "egret-svc", false)
	svc := c.newBackend(t, "backend", 3)
	t.Logf("backend %s: 3 replicas Ready and in kube-proxy's rules after %v", svc.url, time.Since(start).Round(time.Millisecond))

	t.Run("SpreadWithoutEgret", func(t *testing.T) {
		client := svc.client(t, "client")
		r := svc.spread(t, client, 300)
		svc.requireSpread(t, r, 300)
		if r.ViaEgret != 0 {
			t.Fatalf("%d answers came through egret: the client is not opted in", r.ViaEgret)
		}
	})
	without503 := map[string]int{}
	t.Run("OneReplica503WithoutEgret", func(t *testing.T) {
		client := svc.client(t, "client")
		bad := svc.fail(t, 0, 503)
		r := svc.spread(t, client, 60)
		svc.heal(t, bad)
		if r.Requests != 60 || r.Errors != 0 {
			t.Fatalf("60 GETs: %+v", r)
		}
		if r.ByPod[bad] != r.ByStatus["503"] {
			t.Fatalf("503s %d, answers from %s %d: only it fails (%+v)", r.ByStatus["503"], bad, r.ByPod[bad], r)
		}
		// Measured, not asserted: kube-proxy's random choice sends about
		// a third to the failing replica and nothing retries.
		t.Logf("without egret, one replica of 3 answering 503: %d of 60 GETs got 200 (%d got 503 from %s)",
			r.ByStatus["200"], r.ByStatus["503"], bad)
		without503["200"] = r.ByStatus["200"]
		if r.ByStatus["503"] == 0 {
			t.Fatalf("no GET reached the failing replica %s: %+v", bad, r)
		}
	})

	c.installEgret(t)
	svc.egretClients(t, "egret-a", "egret-b", "egret-c")
	t.Run("SpreadThroughEgret", func(t *testing.T) {
		r := svc.spread(t, "egret-a", 300)
		svc.requireSpread(t, r, 300)
		if r.ViaEgret != 300 {
			t.Fatalf("%d of 300 answers came through egret (Egret-Attempts): %+v", r.ViaEgret, r)
		}
	})
	t.Run("SpreadThroughEgretSeveralClients", func(t *testing.T) {
		// 3 opted-in clients × 100 GETs at once: egret's choice is per
		// request across the node's clients, not per client.
		r := svc.spreadAtOnce(t, 100, "egret-a", "egret-b", "egret-c")
		svc.requireSpread(t, r, 300)
		if r.ViaEgret != 300 {
			t.Fatalf("%d of 300 answers came through egret: %+v", r.ViaEgret, r)
		}
	})
	t.Run("OneReplica503ThroughEgret", func(t *testing.T) {
		// Whichever replica it is: each of the three in turn.
		for i := 0; i < svc.replicas; i++ {
			bad := svc.fail(t, i, 503)
			r := svc.spread(t, "egret-a", 60)
			svc.heal(t, bad)
			if r.Requests != 60 || r.Errors != 0 || r.ByStatus["200"] != 60 || r.ViaEgret != 60 {
				t.Errorf("replica %s answering 503: want 60 of 60 GETs answered 200 through egret, got %+v", bad, r)
			}
			if r.ByPod[bad] != 0 {
				t.Errorf("%d answers came from the failing replica %s: %+v", r.ByPod[bad], bad, r)
			}
			retried := 0
			for a, k := range r.ByAttempts {
				if a != "1" {
					retried += k
				}
			}
			if retried == 0 {
				t.Errorf("no GET needed a second attempt: the failing replica %s was never chosen (%+v)", bad, r)
			}
			t.Logf("through egret, replica %s (%d of 3) answering 503: %d of 60 GETs got 200, %d of them after a retry (by attempts %v); without egret: %d of 60",
				bad, i+1, r.ByStatus["200"], retried, r.ByAttempts, without503["200"])
		}
	})
	t.Run("EndpointLeftIsNotReused", func(t *testing.T) { svc.testEndpointLeft(t, "egret-a") })
	t.Run("RolloutRestart", func(t *testing.T) {
		t.Run("Graceful", func(t *testing.T) { svc.rolloutBoth(t, "graceful") })
		t.Run("Abrupt", func(t *testing.T) {
			// Every replica exits at SIGTERM, resetting its connections;
			// a POST is answered 100 ms after it ran, so that a POST is
			// often in flight when its replica dies.
			for _, p := range svc.pods(t) {
				svc.admin(t, p, "/abrupt?post-delay=100ms")
			}
			svc.rolloutBoth(t, "abrupt")
		})
	})
	t.Run("MetricsBounded", func(t *testing.T) { svc.testMetricsBounded(t) })
	t.Logf("TestServices took %v", time.Since(start).Round(time.Millisecond))
}

// service is a backend Deployment of testbin serve behind a ClusterIP
// Service (port 80 to the pods' 8080), called by its cluster DNS name.
type service struct {
	c        *cluster
	name     string
	replicas int
	url      string
	// seen are the addresses of every replica listed so far.
	seen map[string]bool
}

// newBackend creates the Deployment and the Service and waits until every
// replica is Ready and kube-proxy's rules send the ClusterIP to each.
func (c *cluster) newBackend(t testing.TB, name string, replicas int) *service {
	t.Helper()
	n := int32(replicas)
	grace := int64(5)
	labels := map[string]string{"app": name}
	// Where the replicas record their executions (testbin serve -record):
	// a directory of the node's, so that a replica's record outlives it.
	if err := os.MkdirAll(c.execDir(), 0o755); err != nil {
		t.Fatal(err)
	}
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
						HostPath: &corev1.HostPathVolumeSource{Path: c.execDir(), Type: &dirType}}}},
					Containers: []corev1.Container{{
						Name: "c", Image: kubenode.ToolsImage, ImagePullPolicy: corev1.PullNever,
						// A POST is answered 10 ms after it ran: a stop
						// can fall between the effect and the answer.
						Command:      []string{"/testbin", "serve", "-listen", ":8080", "-admin", ":8081", "-record", "/exec", "-post-delay", "10ms"},
						VolumeMounts: []corev1.VolumeMount{{Name: "exec", MountPath: "/exec"}},
						Ports:        []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(8080)}},
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
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	if _, err := c.n.Client.CoreV1().Services(c.ns).Create(c.ctx(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &service{c: c, name: name, replicas: replicas, url: "http://" + kubenode.ServiceHost(c.ns, name) + "/", seen: map[string]bool{}}
	svc.waitReady(t, 3*time.Minute)
	return svc
}

// waitReady waits for the Deployment's rollout (kubectl rollout status)
// and then for kube-proxy's rules to have one endpoint per replica.
func (s *service) waitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	if out, err := s.c.n.KubectlErr("rollout", "status", "-n", s.c.ns, "deployment/"+s.name, "--timeout", timeout.String()); err != nil {
		t.Fatalf("rollout status: %v\n%s\npods:\n%s", err, out, s.c.n.Kubectl(t, "get", "pods", "-n", s.c.ns, "-o", "wide"))
	}
	var last int
	waitFor(t, 30*time.Second, fmt.Sprintf("kube-proxy's rules for %s/%s with %d endpoints", s.c.ns, s.name, s.replicas), func() bool {
		last = s.proxyEndpoints(t)
		return last == s.replicas
	})
}

// proxyEndpoints counts the endpoints kube-proxy's iptables rules (in the
// node's network namespace) send the Service to.
func (s *service) proxyEndpoints(t testing.TB) int {
	out, err := s.c.n.Command(s.c.ctx(), "iptables-save", "-t", "nat").Output()
	if err != nil {
		t.Fatalf("iptables-save in the node: %v", err)
	}
	count := 0
	comment := fmt.Sprintf("%s/%s:http", s.c.ns, s.name)
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "-A KUBE-SVC-") && strings.Contains(l, comment) && strings.Contains(l, "-j KUBE-SEP-") {
			count++
		}
	}
	return count
}

// client creates a client pod (opts: optIn for one behind egret) and
// waits until it is Ready; it is deleted when the test ends.
func (s *service) client(t testing.TB, name string, opts ...podOpt) string {
	t.Helper()
	s.c.newPod(t, name, []string{"pause"}, opts...)
	t.Cleanup(func() { s.c.deletePod(t, name) })
	s.c.n.WaitPod(t, s.c.ns, name, 2*time.Minute, "Ready", kubenode.PodReady)
	return name
}

// spreadResult is what testbin spread prints.
type spreadResult struct {
	Requests int            `json:"requests"`
	ByPod    map[string]int `json:"by_pod"`
	ByStatus map[string]int `json:"by_status"`
	ViaEgret int            `json:"via_egret"`
	// ByAttempts counts the answers through egret by Egret-Attempts.
	ByAttempts map[string]int `json:"by_attempts"`
	Errors     int            `json:"errors"`
	Samples    []string       `json:"error_samples"`
}

// spread sends n GETs from the client pod to the Service's name, each on
// a new connection after a new lookup through the cluster DNS.
func (s *service) spread(t testing.TB, pod string, n int) spreadResult {
	t.Helper()
	start := time.Now()
	out := s.c.exec(t, pod, "spread", "-n", fmt.Sprint(n), s.url)
	var r spreadResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("spread: %v: %q", err, out)
	}
	t.Logf("%d GETs from %s to %s in %v: by pod %v, by status %v, via egret %d, errors %d %q",
		r.Requests, pod, s.url, time.Since(start).Round(time.Millisecond), r.ByPod, r.ByStatus, r.ViaEgret, r.Errors, r.Samples)
	return r
}

// requireSpread fails unless all n answers were 200 and every replica
// answered at least a fifth of them.
func (s *service) requireSpread(t testing.TB, r spreadResult, n int) {
	t.Helper()
	if r.Requests != n || r.Errors != 0 || r.ByStatus["200"] != n {
		t.Fatalf("want %d answers 200: %+v", n, r)
	}
	pods := s.pods(t)
	for _, p := range pods {
		if r.ByPod[p] < n/5 {
			t.Errorf("replica %s answered %d of %d GETs, want at least %d (a fifth): %v", p, r.ByPod[p], n, n/5, r.ByPod)
		}
	}
	if len(r.ByPod) != len(pods) {
		t.Errorf("answers came from %v; the replicas are %v", r.ByPod, pods)
	}
}

// pods lists the backend's running replicas' names (sorted).
func (s *service) pods(t testing.TB) []string {
	t.Helper()
	list, err := s.c.n.Client.CoreV1().Pods(s.c.ns).List(s.c.ctx(), metav1.ListOptions{LabelSelector: "app=" + s.name})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		if p.Status.PodIP != "" {
			s.seen[p.Status.PodIP] = true
		}
		if p.DeletionTimestamp == nil && kubenode.PodReady(&p) {
			out = append(out, p.Name)
		}
	}
	sort.Strings(out)
	if len(out) != s.replicas {
		t.Fatalf("%d Ready replicas of %s, want %d", len(out), s.name, s.replicas)
	}
	return out
}

// fail makes the i-th replica (by name) answer status to everything
// (testbin serve's admin port, reached from the node, not through the
// Service) and returns its name.
func (s *service) fail(t testing.TB, i, status int) string {
	t.Helper()
	name := s.pods(t)[i]
	s.admin(t, name, fmt.Sprintf("/fail?status=%d", status))
	return name
}

// heal makes the replica answer 200 again.
func (s *service) heal(t testing.TB, name string) { s.admin(t, name, "/heal") }

func (s *service) admin(t testing.TB, pod, path string) {
	t.Helper()
	p, err := s.c.n.Client.CoreV1().Pods(s.c.ns).Get(s.c.ctx(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.c.n.HTTPClient(5 * time.Second).Get("http://" + p.Status.PodIP + ":8081" + path)
	if err != nil {
		t.Fatalf("%s %s: %v", pod, path, err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s: %s", pod, path, resp.Status)
	}
}

// installEgret imports egret's image and installs deploy/kubernetes as a
// person does, and waits for a Ready agent (for the egret side of the
// Service figures: then svc.client(t, name, optIn) and
// c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/"+name)).
func (c *cluster) installEgret(t testing.TB) {
	t.Helper()
	start := time.Now()
	c.n.ImportEgret(t, egretImage)
	c.n.Kubectl(t, "apply", "-k", filepath.Join(repoRoot(), "deploy", "kubernetes"))
	ap := c.waitAgentReady(t, 2*time.Minute, nil)
	t.Logf("install: egret image and kubectl apply -k deploy/kubernetes to a Ready agent (%s) in %v", ap.Name, time.Since(start).Round(time.Millisecond))
}
