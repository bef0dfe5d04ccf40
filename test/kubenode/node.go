// Package kubenode runs a real single-node Kubernetes for tests: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, a kubelet and
// kube-proxy in iptables mode (built from the Go module proxy by
// test/kubeapi's tools module), cluster DNS (CoreDNS, built the same way,
// as a pod behind the kube-dns Service) with Debian's containerd, runc and
// CNI plugins, isolated in a mount and network namespace of its own.
//
// Nothing of the node reaches the host's network, mounts, sysctls or
// /run/netns: its bridge, pods, iptables rules and routes live in its
// network namespace; its bpffs, /run/netns, /run/containerd and
// /var/lib/cni are its own mounts; the sysctls the kubelet insists on
// are shown to it by bind mounts inside its mount namespace. What it
// cannot help sharing with the host is the cgroup tree (kubepods in each
// hierarchy) and /sys/fs/cgroup's controllers; Start takes a machine-wide
// lock so that one node runs at a time, and Stop removes every cgroup the
// kubelet and runc made, every process of the node and its work
// directory.
//
//	n := kubenode.Start(t)
//	n.Kubectl(t, "apply", "-k", "deploy/kubernetes")
//	n.Client.CoreV1().Pods("default").Create(…)
//
// See README.md for what it needs and the timings.
package kubenode

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
	"github.com/egret-proxy/egret/agent/netns"
	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/test/kubeapi"
)

// The node's addresses, inside its own network namespace (nothing here is
// routed to or from the host).
const (
	// Name is the node's name.
	Name = "egret-node"
	// IP is the node's address on its pod bridge.
	IP = "10.88.0.1"
	// PodCIDR is the pods' subnet.
	PodCIDR = "10.88.0.0/24"
	// ServiceIP is the kubernetes Service's ClusterIP (kube-proxy sends
	// it to the apiserver).
	ServiceIP = "10.96.0.1"
	// ServiceCIDR is the Services' ClusterIP range.
	ServiceCIDR = "10.96.0.0/24"
	// DNSServiceIP is the kube-dns Service's ClusterIP, the pods'
	// nameserver (kubelet's clusterDNS).
	DNSServiceIP = "10.96.0.10"
	// ClusterDomain is the kubelet's clusterDomain: a Service is
	// NAME.NAMESPACE.svc.cluster.local.
	ClusterDomain = "cluster.local"
	// Bridge is the CNI bridge.
	Bridge = "egretnode0"
	// PauseImage is the sandbox image containerd is set to.
	PauseImage = "egret.test/pause:1"
)

// Node is a running single-node cluster.
type Node struct {
	// Dir is the work directory (configuration, certificates, logs,
	// containerd's and the kubelet's state). Removed by Stop unless the
	// test failed and EGRET_KEEP_NODE=1.
	Dir string
	// Config reaches the apiserver as an admin (system:masters), dialing
	// inside the node's network namespace.
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
	// Kubeconfig is an admin kubeconfig file (for kubectl, run by Kubectl
	// inside the node's network namespace).
	Kubeconfig string
	// NS is the node's network namespace (for listeners and dialers of
	// the test: the ledger upstream, a pod's stats).
	NS *netns.NS
	// Timings of Start.
	Timings map[string]time.Duration

	holder   *kubeapi.Proc
	procs    []*kubeapi.Proc
	names    []string
	lock     *os.File
	madeDirs []string
}

// Start runs the node and waits until it is Ready with the default
// ServiceAccount and kube-root-ca.crt published, which is when pods can be
// created. Everything is stopped and removed in t.Cleanup.
func Start(t testing.TB) *Node {
	t.Helper()
	testenv.RequireRoot(t)
	for _, c := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "kubectl", "unshare", "nsenter", "iptables", "mount"} {
		_, err := exec.LookPath(c)
		testenv.Require(t, err == nil, c+" (apt-get install containerd runc util-linux iptables; kubectl from the machine's image)")
	}
	_, err := os.Stat("/usr/lib/cni/bridge")
	testenv.Require(t, err == nil, "CNI plugins in /usr/lib/cni (apt-get install containernetworking-plugins)")
	bins := kubeapi.Programs(t, kubeapi.Etcd, kubeapi.APIServer, kubeapi.Kubelet, kubeapi.ControllerManager,
		kubeapi.Scheduler, kubeapi.Proxy, kubeapi.CoreDNS)

	n := &Node{Timings: map[string]time.Duration{}}
	t.Cleanup(func() { n.stop(t) })
	if err := n.takeLock(); err != nil {
		t.Fatalf("kubenode: %v", err)
	}
	if err := leftovers(); err != nil {
		t.Fatalf("kubenode: %v", err)
	}
	n.Dir, err = os.MkdirTemp("", "egret-node-")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	step := func(name string, f func() error) {
		t.Helper()
		s := time.Now()
		if err := f(); err != nil {
			t.Fatalf("kubenode: %s: %v", name, err)
		}
		n.Timings[name] = time.Since(s)
	}
	var p *pki
	step("pki", func() error { p, err = makePKI(filepath.Join(n.Dir, "pki")); return err })
	step("namespaces", n.startNamespaces)
	step("etcd", func() error { return n.startEtcd(bins[kubeapi.Etcd]) })
	step("apiserver", func() error { return n.startAPIServer(bins[kubeapi.APIServer], p) })
	step("containerd", n.startContainerd)
	step("images", func() error { return n.importTestImages(t) })
	step("kubelet", func() error { return n.startKubelet(bins[kubeapi.Kubelet], p) })
	step("controllers", func() error {
		return n.startControllers(bins[kubeapi.ControllerManager], bins[kubeapi.Scheduler], p)
	})
	step("kube-proxy", func() error { return n.startKubeProxy(bins[kubeapi.Proxy]) })
	step("ready", n.waitReady)
	step("dns", func() error { return n.startDNS(bins[kubeapi.CoreDNS]) })
	n.Timings["total"] = time.Since(start)
	t.Logf("kubenode: node %s Ready in %v (%v)", Name, n.Timings["total"].Round(time.Millisecond), n.Timings)
	return n
}

// lockPath serialises nodes on a machine: they share the host's cgroup
// tree (kubepods).
const lockPath = "/run/egret-kubenode.lock"

func (n *Node) takeLock() error {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return err
	}
	n.lock = f
	return nil
}

// cgroupDirs are the cgroups a kubelet (cgroupfs driver, root "/") and
// runc make in each hierarchy.
func cgroupDirs() []string {
	var out []string
	for _, top := range []string{"kubepods", "k8s.io"} {
		m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", top))
		out = append(out, m...)
		if p := filepath.Join("/sys/fs/cgroup", top); exists(p) {
			out = append(out, p)
		}
	}
	return out
}

// leftovers removes what a node killed before its clean-up left (a test
// binary killed by a signal or its timeout: the components die with it,
// the containerd shims and the containers do not): under the machine-wide
// lock any such thing is a dead node's. Its processes (those in the
// kubepods cgroups, and the shims and daemons that name an egret-node
// work directory) are killed, its cgroups removed and its work directory
// deleted.
func leftovers() error {
	var errs []error
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmd), filepath.Join(os.TempDir(), "egret-node-")) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for _, d := range cgroupDirs() {
		errs = append(errs, bpftest.RemoveCgroupTree(d))
	}
	old, _ := filepath.Glob(filepath.Join(os.TempDir(), "egret-node-*"))
	for _, d := range old {
		errs = append(errs, os.RemoveAll(d))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing what an earlier node left: %w", err)
	}
	return nil
}

// startNamespaces starts the process that holds the node's mount and
// network namespaces and sets them up.
func (n *Node) startNamespaces() error {
	for _, d := range []string{"etc/cni", "etc/manifests", "log", "var", "run", "sysctl", "images", "pod-logs"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return err
		}
	}
	// The kubelet checks that these have the values it wants
	// (protectKernelDefaults); they are the host's, so the node sees
	// files with those values bound over them in its mount namespace.
	sysctls := map[string]string{"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
	var script strings.Builder
	script.WriteString("set -eu\nmount --make-rshared /\n")
	script.WriteString("mount -t bpf bpf /sys/fs/bpf\nmount --make-shared /sys/fs/bpf\n")
	for k, v := range sysctls {
		f := filepath.Join(n.Dir, "sysctl", strings.ReplaceAll(k, "/", "_"))
		if err := os.WriteFile(f, []byte(v+"\n"), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(&script, "mount --bind %s /proc/sys/%s\n", f, k)
	}
	// Runtime state that would land on the host (pod netns bind mounts,
	// runc's state, libcni's cache): tmpfs, gone with the namespace.
	for _, d := range []string{"/run/netns", "/run/containerd", "/var/lib/cni"} {
		if !exists(d) {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
			n.madeDirs = append(n.madeDirs, d)
		}
		fmt.Fprintf(&script, "mount -t tmpfs tmpfs %s\n", d)
	}
	script.WriteString("mount --make-shared /run/netns\n")
	fmt.Fprintf(&script, `ip link set lo up
ip link add %[1]s type bridge
ip addr add %[2]s/24 dev %[1]s
ip link set %[1]s up
# ClusterIPs must be routable from the node itself (hostNetwork pods, the
# node's own processes): a real node routes them by its default route and
# kube-proxy's nat OUTPUT rules DNAT them after that lookup. The node has
# no uplink, so the Service range goes to the bridge.
ip route add %[4]s dev %[1]s src %[2]s
echo ready > %[3]s
exec sleep infinity
`, Bridge, IP, filepath.Join(n.Dir, "run", "ns-ready"), ServiceCIDR)
	h, err := kubeapi.StartProc("namespaces", "unshare", filepath.Join(n.Dir, "log", "namespaces.log"),
		"--mount", "--net", "--propagation", "private", "sh", "-c", script.String())
	if err != nil {
		return err
	}
	n.holder = h
	if err := h.WaitFor(30*time.Second, func() bool { return exists(filepath.Join(n.Dir, "run", "ns-ready")) }); err != nil {
		return err
	}
	n.NS, err = netns.Open(fmt.Sprintf("/proc/%d/ns/net", h.Pid()))
	return err
}

// Root is the node's root filesystem as the node sees it (its mounts:
// bpffs, /run/netns), through /proc/PID/root of the namespace holder.
func (n *Node) Root() string { return fmt.Sprintf("/proc/%d/root", n.holder.Pid()) }

// HolderPID is the process holding the node's namespaces (nsenter -t).
func (n *Node) HolderPID() int { return n.holder.Pid() }

// start runs bin inside the node's namespaces.
func (n *Node) start(name, bin string, args ...string) (*kubeapi.Proc, error) {
	all := append([]string{"--target", strconv.Itoa(n.holder.Pid()), "--mount", "--net", "--", bin}, args...)
	p, err := kubeapi.StartProc(name, "nsenter", filepath.Join(n.Dir, "log", name+".log"), all...)
	if err != nil {
		return nil, err
	}
	n.procs = append(n.procs, p)
	n.names = append(n.names, name)
	return p, nil
}

// Command returns a command that runs inside the node's mount and network
// namespaces.
func (n *Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	all := append([]string{"--target", strconv.Itoa(n.holder.Pid()), "--mount", "--net", "--", name}, args...)
	return exec.CommandContext(ctx, "nsenter", all...)
}

// Kubectl runs kubectl (the machine's) against the node as its admin, in
// the node's network namespace and the host's mount namespace (paths are
// the test's), and returns its standard output; a failure fails the test.
func (n *Node) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := n.KubectlErr(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// KubectlCommand returns kubectl with args as a command to start (for
// kubectl logs -f, kubectl port-forward): in the node's network
// namespace, as its admin.
func (n *Node) KubectlCommand(ctx context.Context, args ...string) *exec.Cmd {
	all := append([]string{"--target", strconv.Itoa(n.holder.Pid()), "--net", "--", "kubectl", "--kubeconfig", n.Kubeconfig}, args...)
	return exec.CommandContext(ctx, "nsenter", all...)
}

// KubectlErr is Kubectl that returns the error (with kubectl's standard
// error) instead.
func (n *Node) KubectlErr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	all := append([]string{"--target", strconv.Itoa(n.holder.Pid()), "--net", "--", "kubectl", "--kubeconfig", n.Kubeconfig}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", all...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func (n *Node) startEtcd(bin string) error {
	p, err := n.start("etcd", bin, "--name=node", "--data-dir="+filepath.Join(n.Dir, "var", "etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=node=http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level=warn")
	if err != nil {
		return err
	}
	hc := n.httpClient(2 * time.Second)
	return p.WaitFor(60*time.Second, func() bool {
		resp, err := hc.Get("http://127.0.0.1:2379/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// httpClient dials inside the node's network namespace.
func (n *Node) httpClient(timeout time.Duration) *http.Client {
	d := &netns.Dialer{NS: n.NS, Timeout: timeout}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// HTTPClient returns a client whose connections are made inside the
// node's network namespace (to reach a pod's address).
func (n *Node) HTTPClient(timeout time.Duration) *http.Client { return n.httpClient(timeout) }

func (n *Node) startAPIServer(bin string, p *pki) error {
	proc, err := n.start("kube-apiserver", bin,
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0", "--advertise-address="+IP, "--secure-port=6443",
		"--tls-cert-file="+p.file("apiserver.crt"), "--tls-private-key-file="+p.file("apiserver.key"),
		"--client-ca-file="+p.file("ca.crt"), "--token-auth-file="+p.file("tokens.csv"),
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p.file("sa.pub"), "--service-account-signing-key-file="+p.file("sa.key"),
		"--service-cluster-ip-range="+ServiceCIDR, "--allow-privileged=true",
		"--kubelet-client-certificate="+p.file("kubelet-client.crt"), "--kubelet-client-key="+p.file("kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--profiling=false", "--cert-dir="+filepath.Join(n.Dir, "var", "apiserver-certs"))
	if err != nil {
		return err
	}
	d := &netns.Dialer{NS: n.NS}
	n.Config = &rest.Config{
		Host:            "https://127.0.0.1:6443",
		BearerToken:     p.tokens["admin"],
		TLSClientConfig: rest.TLSClientConfig{CAData: p.caPEM},
		QPS:             200, Burst: 400, Timeout: 30 * time.Second,
		Dial: d.DialContext,
	}
	n.Client, err = kubernetes.NewForConfig(n.Config)
	if err != nil {
		return err
	}
	if err := proc.WaitFor(120*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		body, err := n.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && strings.TrimSpace(string(body)) == "ok"
	}); err != nil {
		return err
	}
	for user, token := range p.tokens {
		if err := writeKubeconfig(filepath.Join(n.Dir, user+".kubeconfig"), p.caPEM, token); err != nil {
			return err
		}
	}
	n.Kubeconfig = filepath.Join(n.Dir, "admin.kubeconfig")
	return nil
}

func writeKubeconfig(path string, ca []byte, token string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["node"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:6443", CertificateAuthorityData: ca}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["node"] = &clientcmdapi.Context{Cluster: "node", AuthInfo: "user", Namespace: "default"}
	kc.CurrentContext = "node"
	return clientcmd.WriteToFile(*kc, path)
}

func (n *Node) startContainerd() error {
	d := n.Dir
	conf := fmt.Sprintf(`version = 2
root = "%[1]s/var/containerd"
state = "%[1]s/run/containerd"
[grpc]
  address = "%[1]s/run/containerd.sock"
[ttrpc]
  address = "%[1]s/run/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/var/containerd-opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[2]q
  # CAP_SYS_RESOURCE may be missing (it is on the test VMs): never ask
  # runc for an oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "%[1]s/etc/cni"
`, d, PauseImage)
	if err := os.WriteFile(filepath.Join(d, "etc", "containerd.toml"), []byte(conf), 0o644); err != nil {
		return err
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "egret-node",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "rangeStart": "10.88.0.10", "rangeEnd": "10.88.0.250", "gateway": %q}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "loopback"}
  ]
}
`, Bridge, PodCIDR, IP, filepath.Join(d, "var", "cni-ipam"))
	if err := os.WriteFile(filepath.Join(d, "etc", "cni", "10-egret-node.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	p, err := n.start("containerd", "containerd", "--config", filepath.Join(d, "etc", "containerd.toml"))
	if err != nil {
		return err
	}
	return p.WaitFor(60*time.Second, func() bool { return n.ctr(context.Background(), "version") == nil })
}

// ctr runs ctr against the node's containerd in the k8s.io namespace.
func (n *Node) ctr(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	all := append([]string{"-a", filepath.Join(n.Dir, "run", "containerd.sock"), "-n", "k8s.io"}, args...)
	if b, err := n.Command(ctx, "ctr", all...).CombinedOutput(); err != nil {
		return fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, b)
	}
	return nil
}

// ImportImage imports an OCI image archive (internal/ociimage,
// deploy/image) into the node's containerd, where the kubelet finds it
// without a pull.
func (n *Node) ImportImage(path string) error {
	return n.ctr(context.Background(), "images", "import", "--no-unpack=false", path)
}

func (n *Node) startKubelet(bin string, p *pki) error {
	d := n.Dir
	if err := os.WriteFile(filepath.Join(d, "etc", "resolv.conf"), []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		return err
	}
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[2]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %[3]s}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://%[1]s/run/containerd.sock
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: true
podLogsDir: %[1]s/pod-logs
resolvConf: %[1]s/etc/resolv.conf
clusterDomain: %[4]s
clusterDNS: [%[5]s]
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
rotateCertificates: false
staticPodPath: %[1]s/etc/manifests
syncFrequency: 10s
fileCheckFrequency: 5s
# A container that exits is restarted after 1 s, not after the default
# back-off that doubles from 10 s to 5 min: the tests restart the agent's
# container ten times in a row and measure egret's gap, not the kubelet's
# back-off (KEP-4603).
featureGates: {KubeletCrashLoopBackOffMax: true}
crashLoopBackOff: {maxContainerRestartPeriod: 1s}
`, d, IP, p.file("ca.crt"), ClusterDomain, DNSServiceIP)
	if err := os.WriteFile(filepath.Join(d, "etc", "kubelet.yaml"), []byte(conf), 0o644); err != nil {
		return err
	}
	proc, err := n.start("kubelet", bin, "--config", filepath.Join(d, "etc", "kubelet.yaml"),
		"--kubeconfig", filepath.Join(d, "kubelet.kubeconfig"), "--root-dir", filepath.Join(d, "var", "kubelet"),
		"--hostname-override", Name, "--node-ip", IP, "-v", "1")
	if err != nil {
		return err
	}
	return proc.WaitFor(120*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := n.Client.CoreV1().Nodes().Get(ctx, Name, metav1.GetOptions{})
		return err == nil
	})
}

func (n *Node) startControllers(kcm, sched string, p *pki) error {
	kc := filepath.Join(n.Dir, "controller-manager.kubeconfig")
	if _, err := n.start("kube-controller-manager", kcm, "--kubeconfig="+kc,
		"--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--leader-elect=false", "--root-ca-file="+p.file("ca.crt"),
		"--service-account-private-key-file="+p.file("sa.key"),
		"--use-service-account-credentials=false",
		"--bind-address=127.0.0.1", "--secure-port=10257"); err != nil {
		return err
	}
	sc := filepath.Join(n.Dir, "scheduler.kubeconfig")
	_, err := n.start("kube-scheduler", sched, "--kubeconfig="+sc,
		"--authentication-kubeconfig="+sc, "--authorization-kubeconfig="+sc,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=10259")
	return err
}

func (n *Node) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		var why string
		node, err := n.Client.CoreV1().Nodes().Get(ctx, Name, metav1.GetOptions{})
		switch {
		case err != nil:
			why = err.Error()
		case !nodeReady(node):
			why = "node not Ready"
		default:
			_, err1 := n.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
			_, err2 := n.Client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
			if err1 == nil && err2 == nil {
				return nil
			}
			why = fmt.Sprintf("default ServiceAccount: %v; kube-root-ca.crt: %v", err1, err2)
		}
		for i, p := range n.procs {
			select {
			case <-p.Done():
				return fmt.Errorf("%s exited; log:\n%s", n.names[i], n.LogTail(n.names[i], 30))
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after 3m: %s; kubelet log:\n%s", why, n.LogTail("kubelet", 30))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// LogTail returns the last lines of a component's log (etcd,
// kube-apiserver, containerd, kubelet, kube-controller-manager,
// kube-scheduler).
func (n *Node) LogTail(name string, lines int) string {
	b, _ := os.ReadFile(filepath.Join(n.Dir, "log", name+".log"))
	s := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(s) > lines {
		s = s[len(s)-lines:]
	}
	return strings.Join(s, "\n")
}

// stop deletes every pod, stops the components, kills whatever of the node
// is left (containers, shims) and removes its cgroups and work directory.
func (n *Node) stop(t testing.TB) {
	defer func() {
		if n.lock != nil {
			unix.Flock(int(n.lock.Fd()), unix.LOCK_UN)
			n.lock.Close()
		}
	}()
	if n.holder == nil {
		if n.Dir != "" {
			os.RemoveAll(n.Dir)
		}
		return
	}
	if t.Failed() {
		for _, c := range []string{"kubelet", "containerd", "kube-apiserver"} {
			t.Logf("kubenode: %s log (last lines):\n%s", c, n.LogTail(c, 25))
		}
	}
	var errs []error
	// The controllers first: a Deployment's (CoreDNS's, a test's backend)
	// or a DaemonSet's controller would make each deleted pod again, and
	// the wait for no containers below would last its whole minute while
	// containers start again and outlive the node.
	for i, name := range n.names {
		if name == "kube-controller-manager" || name == "kube-scheduler" {
			if err := n.procs[i].Stop(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// Pods then, through the kubelet, so that the sandboxes go the way
	// they go on a node.
	if n.Client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		zero := int64(0)
		nss, _ := n.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if nss != nil {
			for _, ns := range nss.Items {
				_ = n.Client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
			}
		}
		// Polls containerd's task list (an external process's state).
		deadline, _ := ctx.Deadline()
		testenv.Poll(time.Until(deadline), func() bool { return n.ctrTasks() == 0 })
		cancel()
	}
	// Components in reverse order of start.
	for i := len(n.procs) - 1; i >= 0; i-- {
		if err := n.procs[i].Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	// What is left: containers (in kubepods) and shims (in the node's
	// mount namespace, outside the kubepods cgroups).
	for _, d := range cgroupDirs() {
		if err := bpftest.RemoveCgroupTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	if err := killNamespace(n.holder.Pid()); err != nil {
		errs = append(errs, err)
	}
	if n.NS != nil {
		n.NS.Close()
	}
	if err := n.holder.Stop(); err != nil {
		errs = append(errs, err)
	}
	for _, d := range cgroupDirs() {
		if err := bpftest.RemoveCgroupTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range n.madeDirs {
		_ = os.Remove(d)
	}
	if t.Failed() && os.Getenv("EGRET_KEEP_NODE") == "1" {
		t.Logf("kubenode: work directory kept: %s", n.Dir)
	} else if err := os.RemoveAll(n.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		t.Errorf("kubenode: stop: %v", err)
	}
}

// ctrTasks counts the containers containerd still runs (-1 if it cannot
// be asked).
func (n *Node) ctrTasks() int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := n.Command(ctx, "ctr", "-a", filepath.Join(n.Dir, "run", "containerd.sock"), "-n", "k8s.io", "tasks", "ls", "-q").Output()
	if err != nil {
		return -1
	}
	return len(strings.Fields(string(out)))
}

// killNamespace kills every process that shares the holder's mount
// namespace, except the holder (containerd shims reparented to init).
func killNamespace(holder int) error {
	want, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", holder))
	if err != nil {
		return err
	}
	// Polls /proc until no process of the namespace is left (a killed
	// process is reaped by its parent, with no event here), for 5 s.
	gone := testenv.Poll(5*time.Second, func() bool {
		ents, _ := os.ReadDir("/proc")
		left := 0
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == holder || pid == os.Getpid() {
				continue
			}
			if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && ns == want {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				left++
			}
		}
		return left == 0
	})
	if gone {
		return nil
	}
	return errors.New("processes of the node's mount namespace survive SIGKILL")
}

// UnifiedCgroupRoot is where the node's cgroup v2 tree is (the host's: the
// node shares the host's cgroup mounts).
func UnifiedCgroupRoot() string { return cgroup2.Root() }

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// RandName returns prefix followed by 8 random hex digits.
func RandName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// WaitPod waits until the pod satisfies ok, polling its state, or fails
// the test after timeout with the pod's last status.
func (n *Node) WaitPod(t testing.TB, ns, name string, timeout time.Duration, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// A watch of the one pod: woken by each change, not by a timer.
	lw := cache.NewFilteredListWatchFromClient(n.Client.CoreV1().RESTClient(), "pods", ns,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		})
	var last *corev1.Pod
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, func(store cache.Store) (bool, error) {
		obj, exists, err := store.GetByKey(ns + "/" + name)
		if err != nil {
			return false, err
		}
		if !exists {
			return ok(nil), nil
		}
		last = obj.(*corev1.Pod)
		return ok(last), nil
	}, func(e watch.Event) (bool, error) {
		p, isPod := e.Object.(*corev1.Pod)
		if !isPod {
			return false, nil
		}
		if e.Type == watch.Deleted {
			last = nil
			return ok(nil), nil
		}
		last = p
		return ok(p), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s: not %s after %v (last: %s, %v)", ns, name, what, timeout, describe(last), err)
	}
	return last
}

// PodReady reports whether p is Running with every container ready.
func PodReady(p *corev1.Pod) bool {
	if p == nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func describe(p *corev1.Pod) string {
	if p == nil {
		return "none"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s", p.Status.Phase)
	for _, c := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		fmt.Fprintf(&b, "; %s ready=%v restarts=%d", c.Name, c.Ready, c.RestartCount)
		if w := c.State.Waiting; w != nil {
			fmt.Fprintf(&b, " waiting %s %s", w.Reason, w.Message)
		}
		if tm := c.State.Terminated; tm != nil {
			fmt.Fprintf(&b, " terminated %s %d", tm.Reason, tm.ExitCode)
		}
	}
	return b.String()
}

// ContainerLog returns the current log of a pod's container, as the
// kubelet wrote it (the message of each CRI log line).
func (n *Node) ContainerLog(ns, pod, container string) string {
	files := n.OpenContainerLog(ns, pod, container)
	var out strings.Builder
	for _, f := range files {
		out.WriteString(ReadCRILog(f))
		f.Close()
	}
	return out.String()
}

// OpenContainerLog opens the log files of a pod's container: read them
// with ReadCRILog even after the kubelet removed them with the pod.
func (n *Node) OpenContainerLog(ns, pod, container string) []*os.File {
	m, _ := filepath.Glob(filepath.Join(n.Dir, "pod-logs", ns+"_"+pod+"_*", container, "*.log"))
	var out []*os.File
	for _, p := range m {
		if f, err := os.Open(p); err == nil {
			out = append(out, f)
		}
	}
	return out
}

// ReadCRILog reads a CRI log file from its start and returns the messages
// (the fourth field of each line, partial lines joined).
func ReadCRILog(f *os.File) string {
	var out strings.Builder
	sc := bufio.NewScanner(io.NewSectionReader(f, 0, 1<<40))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), " ", 4)
		if len(parts) == 4 {
			out.WriteString(parts[3])
			if parts[2] == "F" {
				out.WriteByte('\n')
			}
		}
	}
	return out.String()
}

// Listen opens a TCP listener inside the node's network namespace (for
// an upstream the pods reach at IP:port).
func (n *Node) Listen(t testing.TB, address string) net.Listener {
	t.Helper()
	ln, err := n.NS.Listen(context.Background(), "tcp", address)
	if err != nil {
		t.Fatalf("kubenode: listen %s: %v", address, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}
