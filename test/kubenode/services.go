package kubenode

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/egret-proxy/egret/agent/netns"
	"github.com/egret-proxy/egret/internal/ociimage"
)

// CoreDNSImage is the cluster DNS's image: the coredns binary of
// test/kubeapi/coredns, built offline like the other test images.
const CoreDNSImage = "egret.test/coredns:1"

// startKubeProxy runs kube-proxy in iptables mode inside the node's
// namespaces, once the kubelet registered the node (kube-proxy reads the
// node's addresses at start), and waits until the kubernetes Service's
// ClusterIP reaches the apiserver through its rules. Its flags leave the
// host alone: --conntrack-max-per-core 0 and the conntrack timeouts at 0
// leave the conntrack sysctls as they are (nf_conntrack_max is
// host-wide); --masquerade-all SNATs Service traffic to the node, so that
// a pod's answer to another pod on the same bridge goes back through the
// node's conntrack (the alternative, br_netfilter, is a host-wide module);
// --iptables-localhost-nodeports=false leaves route_localnet alone. Its
// rules are in the node's network namespace: iptables runs there.
func (n *Node) startKubeProxy(bin string) error {
	p, err := n.start("kube-proxy", bin,
		"--kubeconfig="+filepath.Join(n.Dir, "kube-proxy.kubeconfig"),
		"--hostname-override="+Name, "--proxy-mode=iptables", "--cluster-cidr="+PodCIDR,
		"--masquerade-all", "--iptables-localhost-nodeports=false",
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249")
	if err != nil {
		return err
	}
	hc := n.httpClient(2 * time.Second)
	var why string
	err = p.WaitFor(90*time.Second, func() bool {
		resp, err := hc.Get("http://127.0.0.1:10256/healthz")
		if err != nil {
			why = err.Error()
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			why = "healthz: " + resp.Status
			return false
		}
		// The kubernetes Service through kube-proxy's rules (nat OUTPUT).
		d := &netns.Dialer{NS: n.NS, Timeout: 2 * time.Second}
		c, err := d.DialContext(context.Background(), "tcp", net.JoinHostPort(ServiceIP, "443"))
		if err != nil {
			why = err.Error()
			return false
		}
		c.Close()
		return true
	})
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rules, _ := n.Command(ctx, "iptables-save").CombinedOutput()
		return fmt.Errorf("%v (%s); the node's iptables:\n%s", err, why, rules)
	}
	return nil
}

// startDNS imports CoreDNS's image, applies the cluster DNS (coredns.yaml:
// a Deployment of one CoreDNS behind the kube-dns Service at DNSServiceIP,
// RBAC to read Services, EndpointSlices, pods and namespaces, its Corefile
// in a ConfigMap) and waits until the name of the kubernetes Service
// resolves through the kube-dns ClusterIP (kube-proxy's rules to the
// CoreDNS pod) to ServiceIP.
func (n *Node) startDNS(bin string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	path := filepath.Join(n.Dir, "images", "coredns.tar")
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = ociimage.Write(f, ociimage.Image{Name: CoreDNSImage, Entrypoint: []string{"/coredns"},
		Files: []ociimage.File{{Path: "/coredns", Mode: 0o755, Data: data}, {Path: "/tmp", Mode: 0o1777, Dir: true}}})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := n.ImportImage(path); err != nil {
		return err
	}
	_ = os.Remove(path)
	manifest := filepath.Join(n.Dir, "etc", "coredns.yaml")
	if err := os.WriteFile(manifest, []byte(corednsManifest()), 0o644); err != nil {
		return err
	}
	if out, err := n.KubectlErr("apply", "-f", manifest); err != nil {
		return fmt.Errorf("kubectl apply coredns: %v: %s", err, out)
	}
	r := n.Resolver()
	want := ServiceIP
	var last string
	deadline := time.Now().Add(2 * time.Minute)
	// Polls a name through the cluster DNS: the pod's start has no event
	// that reaches this process.
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ips, err := r.LookupHost(ctx, "kubernetes.default.svc."+ClusterDomain)
		cancel()
		if err == nil && len(ips) == 1 && ips[0] == want {
			return nil
		}
		last = fmt.Sprintf("%v %v", ips, err)
		if time.Now().After(deadline) {
			pods, _ := n.KubectlErr("get", "pods", "-n", "kube-system", "-o", "wide")
			return fmt.Errorf("kubernetes.default.svc.%s did not resolve to %s through %s in 2m (last: %s); pods:\n%s",
				ClusterDomain, want, DNSServiceIP, last, pods)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Resolver asks the cluster DNS (the kube-dns Service's ClusterIP, through
// kube-proxy) from inside the node's network namespace, as a pod does.
func (n *Node) Resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		// DNS over TCP: netns.Dialer dials TCP only (and a client that
		// gets a truncated answer asks over TCP anyway).
		d := &netns.Dialer{NS: n.NS, Timeout: 2 * time.Second}
		return d.DialContext(ctx, "tcp", net.JoinHostPort(DNSServiceIP, "53"))
	}}
}

// ServiceHost is the cluster DNS name of a Service: NAME.NS.svc.cluster.local.
func ServiceHost(ns, name string) string {
	return strings.Join([]string{name, ns, "svc", ClusterDomain}, ".")
}

// corednsManifest is the cluster DNS as kubeadm installs it, cut to what a
// one-node test cluster needs: no forward (the node is offline; names
// outside cluster.local are refused), one replica.
func corednsManifest() string {
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health {
            lameduck 2s
        }
        ready
        kubernetes %[1]s in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 5
        }
        cache 5
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 1
  selector:
    matchLabels: {k8s-app: kube-dns}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      terminationGracePeriodSeconds: 5
      containers:
      - name: coredns
        image: %[2]s
        imagePullPolicy: Never
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          periodSeconds: 10
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 1
      volumes:
      - name: config
        configMap:
          name: coredns
          items: [{key: Corefile, path: Corefile}]
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: %[3]s
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
`, ClusterDomain, CoreDNSImage, DNSServiceIP)
}
