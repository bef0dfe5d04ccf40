package kubenode_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/egret-proxy/egret/agent/pods/kube"
	"github.com/egret-proxy/egret/test/kubenode"
)

// meshUID is the stand-in sidecar's uid, the one its pod's redirect
// leaves alone (Istio's is 1337 too).
const meshUID = 1337

// TestMeshSidecar: a pod that opted in to egret but carries a mesh's
// sidecar (Istio's annotation, an istio-proxy container, and Istio's nat
// OUTPUT redirect in its network namespace) is left to the mesh: a
// Warning Event says why, egret's agent does not take it, and every
// request reaches the sidecar once and is retried by it alone, none lost.
// A pod without the sidecar, opted in on the same node, is behind egret.
func TestMeshSidecar(t *testing.T) {
	c := startCluster(t, "egret-mesh", true)
	c.installEgret(t)

	// The contrast: the same node, a pod opted in without a mesh.
	c.newPod(t, "plain", []string{"pause"}, optIn)
	t.Cleanup(func() { c.deletePod(t, "plain") })
	c.n.WaitPod(t, c.ns, "plain", 2*time.Minute, "Ready", kubenode.PodReady)
	c.waitBehindEgret(t, true, 30*time.Second, c.ns+"/plain")
	c.expectRetried(t, "plain")

	start := time.Now()
	c.newPod(t, "mesh", []string{"pause"}, optIn, istioSidecar)
	t.Cleanup(func() { c.deletePod(t, "mesh") })
	p := c.n.WaitPod(t, c.ns, "mesh", 2*time.Minute, "Ready", kubenode.PodReady)
	ready := time.Since(start)
	// The mesh's init step (istio-init, or its CNI plugin): every TCP
	// connect of the pod but the sidecar's own and loopback's goes to
	// the sidecar. The test installs it from the node (the images have no
	// iptables) before any request of the pod.
	c.meshRedirect(t, p.Status.PodIP)

	var ev corev1.Event
	waitFor(t, 30*time.Second, "the EgretMeshSidecar Event on the pod", func() bool {
		evs := c.events(t, c.ns, "mesh", kube.ReasonMeshSidecar)
		if len(evs) > 0 {
			ev = evs[0]
		}
		return len(evs) > 0
	})
	evAfter := time.Since(start)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, "Istio (annotation sidecar.istio.io/status)") ||
		!strings.Contains(ev.Message, "left out") {
		t.Errorf("Event: %s %s: %q", ev.Type, ev.Reason, ev.Message)
	}
	t.Logf("Event %s %s (%v after the pod was created, pod Ready after %v): %s", ev.Type, ev.Reason, evAfter.Round(time.Millisecond), ready.Round(time.Millisecond), ev.Message)

	const requests = 20
	ids := make([]string, requests)
	var slowest time.Duration
	for i := range ids {
		ids[i] = kubenode.RandName("mesh-")
		sent := time.Now()
		r := c.get503Once(t, "mesh", ids[i])
		slowest = max(slowest, time.Since(sent))
		if !strings.Contains(r.status, "200") || r.headers["Sidecar-Attempts"] != "2" || r.headers["Egret-Attempts"] != "" {
			t.Fatalf("request %s: %s, Sidecar-Attempts %q, Egret-Attempts %q: want 200 after the sidecar's retry, egret not on the path (headers %v)",
				ids[i], r.status, r.headers["Sidecar-Attempts"], r.headers["Egret-Attempts"], r.headers)
		}
	}
	st := c.sidecarStats(t, p.Status.PodIP)
	executed := 0
	for _, id := range ids {
		executed += c.led.Executions(id)
		if st.ByID[id] != 1 {
			t.Errorf("the sidecar received %s %d times, want once", id, st.ByID[id])
		}
		if n := c.led.Executions(id); n != 2 {
			t.Errorf("the ledger executed %s %d times, want 2 (the 503, the sidecar's retry)", id, n)
		}
	}
	if st.Requests != requests || st.Attempts != 2*requests {
		t.Errorf("the sidecar received %d requests and made %d attempts, want %d and %d: %+v", st.Requests, st.Attempts, requests, 2*requests, st)
	}

	// egret none: the agent never listed the pod and logged none of its
	// requests.
	ap := c.agentPod(t)
	list, err := c.agentPods(t, ap)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := list[c.ns+"/mesh"]; ok {
		t.Errorf("the agent has the mesh pod: %+v", s)
	}
	egretSaw := 0
	for _, l := range c.agentLogLines(ap, "request") {
		if l["pod"] == c.ns+"/mesh" {
			egretSaw++
		}
	}
	if egretSaw != 0 {
		t.Errorf("egret's log has %d requests of the mesh pod", egretSaw)
	}
	t.Logf("%d requests of the mesh pod (each 503 once): the sidecar received %d (each id once: %v), made %d attempts; the ledger executed %d; egret saw %d; all 200; slowest %v",
		requests, st.Requests, st.Requests == len(st.ByID), st.Attempts, executed, egretSaw, slowest.Round(time.Millisecond))
}

// istioSidecar makes the pod look as Istio's injector leaves it: its
// status annotation and an istio-proxy container, here the stand-in
// sidecar (testbin sidecar) under the uid the redirect leaves alone.
func istioSidecar(p *corev1.Pod) {
	p.Annotations["sidecar.istio.io/status"] = `{"containers":["istio-proxy"],"initContainers":["istio-init"]}`
	uid := int64(meshUID)
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
		Name: "istio-proxy", Image: kubenode.ToolsImage, ImagePullPolicy: corev1.PullNever,
		Command:         []string{"/testbin", "sidecar", "-listen", ":15001", "-admin", ":15020", "-retries", "2"},
		SecurityContext: &corev1.SecurityContext{RunAsUser: &uid},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(15020)}},
			PeriodSeconds: 1,
		},
	})
}

// meshRedirect installs Istio's outbound redirect in the network
// namespace of the pod with address podIP: nat OUTPUT sends every TCP
// connect to the sidecar's port 15001 but the sidecar's own (its uid) and
// those to 127.0.0.1. The rules go with the namespace.
func (c *cluster) meshRedirect(t testing.TB, podIP string) {
	t.Helper()
	script := `for ns in /run/netns/*; do
  if nsenter --net="$ns" ip -4 -o addr 2>/dev/null | grep -q " ` + podIP + `/"; then
    nsenter --net="$ns" iptables -w -t nat -N MESH_OUTPUT &&
    nsenter --net="$ns" iptables -w -t nat -A OUTPUT -p tcp -j MESH_OUTPUT &&
    nsenter --net="$ns" iptables -w -t nat -A MESH_OUTPUT -m owner --uid-owner ` + strconv.Itoa(meshUID) + ` -j RETURN &&
    nsenter --net="$ns" iptables -w -t nat -A MESH_OUTPUT -d 127.0.0.1/32 -j RETURN &&
    nsenter --net="$ns" iptables -w -t nat -A MESH_OUTPUT -p tcp -j REDIRECT --to-ports 15001 &&
    nsenter --net="$ns" iptables -w -t nat -S; exit
  fi
done
echo "no netns with ` + podIP + `" >&2; exit 1`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := c.n.Command(ctx, "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("mesh redirect in the pod %s's namespace: %v: %s", podIP, err, out)
	}
	t.Logf("the pod's nat table:\n%s", strings.TrimSpace(string(out)))
}

// sidecarStats are testbin sidecar's counts.
type sidecarStats struct {
	Requests int            `json:"requests"`
	Attempts int            `json:"attempts"`
	ByID     map[string]int `json:"by_id"`
	Errors   []string       `json:"errors"`
}

func (c *cluster) sidecarStats(t testing.TB, podIP string) sidecarStats {
	t.Helper()
	resp, err := c.n.HTTPClient(5 * time.Second).Get("http://" + podIP + ":15020/stats")
	if err != nil {
		t.Fatalf("sidecar stats: %v", err)
	}
	defer resp.Body.Close()
	var s sidecarStats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}
