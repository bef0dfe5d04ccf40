// Package kubeapi runs a real Kubernetes API server for tests: etcd and
// kube-apiserver as processes on loopback, built from source by the nested
// tools module (test/kubeapi/tools, a module of its own so that egret's
// go.mod never requires k8s.io/kubernetes).
//
// There is no kubelet, scheduler or controller manager: objects are stored
// and watched exactly as on a cluster, but nothing acts on them. A test
// sets a pod's spec.nodeName and status itself; a pod deleted with a grace
// period keeps its deletionTimestamp until deleted again with grace 0; a
// namespace never finishes terminating (use a fresh one per test,
// Cluster.Namespace).
//
//	c := kubeapi.Start(t)
//	pods, err := c.Client.CoreV1().Pods(c.Namespace(t)).List(ctx, metav1.ListOptions{})
//
// Everything Start makes (processes, data, certificates) is stopped and
// removed in t.Cleanup. See README.md for the build and the timings.
package kubeapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// AdminUser is the user the Cluster's Config authenticates as (a bearer
// token of the apiserver's token file); it is in system:masters.
const AdminUser = "egret-test-admin"

// ServiceClusterIPRange is the apiserver's --service-cluster-ip-range.
const ServiceClusterIPRange = "10.96.0.0/24"

// Options change how the cluster runs. The zero value is what Start uses.
type Options struct {
	// RBAC runs the apiserver with --authorization-mode=RBAC instead of
	// AlwaysAllow, so that ConfigAs users are held to their roles (the
	// admin, in system:masters, still may do anything).
	RBAC bool
	// APIServerArgs are extra kube-apiserver flags (they come last).
	APIServerArgs []string
}

// Cluster is a running etcd and kube-apiserver.
type Cluster struct {
	// Config reaches the apiserver as AdminUser (bearer token, the test
	// CA); QPS and Burst are raised for tests.
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
	// Kubeconfig is the path of a kubeconfig file for Config (for a
	// command under test: `egret agent --kubeconfig`, kubectl).
	Kubeconfig string
	// URL is the apiserver's address, https://127.0.0.1:PORT.
	URL string
	// EtcdURL is etcd's client URL, http://127.0.0.1:PORT.
	EtcdURL string
	// Dir holds the certificates, the logs (etcd.log, kube-apiserver.log)
	// and etcd's data; removed at the end of the test.
	Dir string

	etcd, api *Proc
}

// Start runs etcd and kube-apiserver for the test, waits until the
// apiserver's /readyz answers ok and returns the cluster. The binaries are
// built the first time on a machine (see Binaries): give `go test` a
// -timeout of 20m or more for that run.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with options.
func StartWith(t testing.TB, o Options) *Cluster {
	t.Helper()
	apiBin, etcdBin := Binaries(t)
	c := &Cluster{Dir: t.TempDir()}
	t.Cleanup(func() { c.stop(t) })

	start := time.Now()
	var err error
	for try := 1; ; try++ {
		// A free port found now may be taken before the process binds it:
		// start again with others.
		err = c.startEtcd(etcdBin)
		if err == nil {
			err = c.startAPIServer(apiBin, o)
		}
		if err == nil || !errors.Is(err, errPortTaken) || try == 3 {
			break
		}
		c.stop(t)
	}
	if err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	t.Logf("kubeapi: etcd %s, kube-apiserver %s ready in %v", c.EtcdURL, c.URL, time.Since(start).Round(time.Millisecond))
	return c
}

var errPortTaken = errors.New("port taken")

func (c *Cluster) startEtcd(bin string) error {
	client, peer := freePort(), freePort()
	c.EtcdURL = "http://127.0.0.1:" + client
	peerURL := "http://127.0.0.1:" + peer
	data := filepath.Join(c.Dir, "etcd")
	_ = os.RemoveAll(data)
	p, err := StartProc("etcd", bin, filepath.Join(c.Dir, "etcd.log"),
		"--name=egret-test",
		"--data-dir="+data,
		"--listen-client-urls="+c.EtcdURL,
		"--advertise-client-urls="+c.EtcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=egret-test="+peerURL,
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	c.etcd = p
	hc := &http.Client{Timeout: 2 * time.Second}
	return p.WaitFor(30*time.Second, func() bool {
		resp, err := hc.Get(c.EtcdURL + "/health")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func (c *Cluster) startAPIServer(bin string, o Options) error {
	certs := filepath.Join(c.Dir, "certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return err
	}
	pk, err := makePKI(certs)
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	token := randHex(16)
	tokens := filepath.Join(certs, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(fmt.Sprintf("%s,%s,%s-uid,\"system:masters\"\n", token, AdminUser, AdminUser)), 0o600); err != nil {
		return err
	}
	port := freePort()
	c.URL = "https://127.0.0.1:" + port
	authz := "AlwaysAllow"
	if o.RBAC {
		authz = "RBAC"
	}
	args := []string{
		"--etcd-servers=" + c.EtcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + port,
		"--cert-dir=" + certs,
		"--tls-cert-file=" + pk.certFile,
		"--tls-private-key-file=" + pk.keyFile,
		"--token-auth-file=" + tokens,
		"--authorization-mode=" + authz,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pk.saPubFile,
		"--service-account-signing-key-file=" + pk.saKeyFile,
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--disable-admission-plugins=ServiceAccount",
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
	}
	p, err := StartProc("kube-apiserver", bin, filepath.Join(c.Dir, "kube-apiserver.log"), append(args, o.APIServerArgs...)...)
	if err != nil {
		return err
	}
	c.api = p

	c.Config = &rest.Config{
		Host:            c.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: pk.caPEM},
		QPS:             200,
		Burst:           400,
		Timeout:         30 * time.Second,
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	c.Client = cs
	if err := p.WaitFor(90*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && strings.TrimSpace(string(body)) == "ok"
	}); err != nil {
		return err
	}

	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	return c.writeKubeconfig(c.Kubeconfig, "", nil)
}

// writeKubeconfig writes a kubeconfig for the admin, impersonating user
// (and groups) if user is not empty.
func (c *Cluster) writeKubeconfig(path, user string, groups []string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["egret-test"] = &clientcmdapi.Cluster{Server: c.URL, CertificateAuthorityData: c.Config.CAData}
	kc.AuthInfos[AdminUser] = &clientcmdapi.AuthInfo{Token: c.Config.BearerToken, Impersonate: user, ImpersonateGroups: groups}
	kc.Contexts["egret-test"] = &clientcmdapi.Context{Cluster: "egret-test", AuthInfo: AdminUser, Namespace: "default"}
	kc.CurrentContext = "egret-test"
	return clientcmd.WriteToFile(*kc, path)
}

// KubeconfigAs writes a kubeconfig file for ConfigAs(user, groups...) and
// returns its path: a command under test then runs as that user (held to
// its roles with Options.RBAC).
func (c *Cluster) KubeconfigAs(t testing.TB, user string, groups ...string) string {
	t.Helper()
	path := filepath.Join(c.Dir, "kubeconfig-"+randHex(4))
	if err := c.writeKubeconfig(path, user, groups); err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	return path
}

// ConfigAs returns a copy of Config that impersonates user in groups (the
// admin may impersonate anyone). With Options.RBAC the apiserver holds the
// requests to that user's roles; a service account is
// "system:serviceaccount:NAMESPACE:NAME" in group "system:serviceaccounts".
func (c *Cluster) ConfigAs(user string, groups ...string) *rest.Config {
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// Namespace creates a fresh namespace for the test (prefix egret-t-) and
// returns its name. It is not deleted: without a controller manager a
// namespace never finishes terminating, and the cluster goes at the end of
// the test anyway.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	ns, err := c.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "egret-t-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubeapi: create namespace: %v", err)
	}
	return ns.Name
}

// PIDs returns the process ids of etcd and kube-apiserver.
func (c *Cluster) PIDs() []int {
	var pids []int
	for _, p := range []*Proc{c.etcd, c.api} {
		if p != nil {
			pids = append(pids, p.cmd.Process.Pid)
		}
	}
	return pids
}

// LogTail returns the last n lines of the apiserver's log (or etcd's).
func (c *Cluster) LogTail(name string, n int) string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, name+".log"))
	return tail(string(b), n)
}

func (c *Cluster) stop(t testing.TB) {
	if t.Failed() && c.api != nil {
		t.Logf("kubeapi: kube-apiserver log (last lines):\n%s", c.LogTail("kube-apiserver", 40))
	}
	// The apiserver first: it would complain about a vanished etcd.
	for _, p := range []*Proc{c.api, c.etcd} {
		if p != nil {
			if err := p.Stop(); err != nil {
				t.Errorf("kubeapi: %v", err)
			}
		}
	}
	c.api, c.etcd = nil, nil
}

// Proc is a server process of a test. It is started on a goroutine locked
// to its OS thread for the process's life: the child gets SIGKILL when the
// test process dies (Pdeathsig, which follows the thread that forked), so
// a test binary killed by its timeout leaves no server behind.
type Proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// StartProc starts bin with args, its output appended to logPath; name is
// for messages.
func StartProc(name, bin, logPath string, args ...string) (*Proc, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	p := &Proc{name: name, cmd: exec.Command(bin, args...), log: logPath, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = lf, lf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := p.cmd.Start(); err != nil {
			started <- err
			close(p.done)
			return
		}
		started <- nil
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

// WaitFor polls ready until it is true, the process exits or timeout.
func (p *Proc) WaitFor(timeout time.Duration, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if ready() {
			return nil
		}
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.log)
			err := fmt.Errorf("%s exited (%v); log:\n%s", p.name, p.err, tail(string(b), 30))
			if strings.Contains(string(b), "address already in use") {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(p.log)
			return fmt.Errorf("%s not ready after %v; log:\n%s", p.name, timeout, tail(string(b), 30))
		}
		// The poll's pause: ready asks a component (its /readyz, say),
		// which announces nothing; its exit ends the wait at once.
		select {
		case <-p.done:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Stop ends the process: SIGTERM, then SIGKILL after 15 s.
func (p *Proc) Stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(15 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s did not stop within 15 s of SIGTERM; killed", p.name)
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("kubeapi: no free loopback port: %v", err))
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
