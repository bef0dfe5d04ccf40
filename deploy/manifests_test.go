package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	sjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/pods/kube"
	egretcli "github.com/egret-proxy/egret/cmd/egret/cli"
	"github.com/egret-proxy/egret/internal/cgroup2"
	"github.com/egret-proxy/egret/proxy/policy"
)

const manifestDir = "kubernetes"

// kustomization is the part of kustomization.yaml that deploy/kubernetes
// uses; strict decoding refuses any other field, so a field added there
// must be added here (and checked).
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images"`
}

// object is one manifest document, decoded strictly into its typed object.
type object struct {
	file string
	obj  runtime.Object
}

// strictDecode decodes one YAML document into the typed k8s.io/api object
// its apiVersion and kind name. Unknown and duplicated fields are errors.
// A document with nothing in it (comments only) gives nil.
func strictDecode(doc []byte) (runtime.Object, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, err
	}
	if s := string(bytes.TrimSpace(js)); s == "null" || s == "" {
		return nil, nil
	}
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return nil, errors.New("document without apiVersion and kind")
	}
	gvk := schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind)
	if _, err := scheme.Scheme.New(gvk); err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	// The API server's own decoder, strict: field names match case and
	// all (encoding/json would take hostPid for hostPID), unknown and
	// repeated fields are errors.
	obj, _, err := strictSerializer.Decode(doc, nil, nil)
	if err != nil {
		return nil, err
	}
	return obj, nil
}

var strictSerializer = kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
	kjson.SerializerOptions{Yaml: true, Strict: true})

// unmarshalStrict decodes YAML into v as strictly as strictDecode does.
func unmarshalStrict(data []byte, v any) error {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	strict, err := sjson.UnmarshalStrict(js, v, sjson.DisallowDuplicateFields, sjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// splitDocs splits a YAML stream at its "---" lines.
func splitDocs(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		d, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		docs = append(docs, d)
	}
}

// loadKustomization reads deploy/kubernetes/kustomization.yaml strictly.
func loadKustomization(t testing.TB) kustomization {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(manifestDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := unmarshalStrict(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	return k
}

// loadManifests decodes every resource the kustomization lists, strictly.
func loadManifests(t testing.TB) []object {
	t.Helper()
	k := loadKustomization(t)
	var objs []object
	for _, res := range k.Resources {
		data, err := os.ReadFile(filepath.Join(manifestDir, res))
		if err != nil {
			t.Fatalf("kustomization.yaml lists %s: %v", res, err)
		}
		docs, err := splitDocs(data)
		if err != nil {
			t.Fatalf("%s: %v", res, err)
		}
		for i, d := range docs {
			obj, err := strictDecode(d)
			if err != nil {
				t.Fatalf("%s, document %d: %v", res, i+1, err)
			}
			if obj != nil {
				objs = append(objs, object{file: res, obj: obj})
			}
		}
	}
	return objs
}

// only returns the one object of type T among objs.
func only[T runtime.Object](t testing.TB, objs []object) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.obj.(T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%d objects of type %T in deploy/kubernetes, want 1", len(found), zero)
	}
	return found[0]
}

func TestManifestsDecodeStrictly(t *testing.T) {
	k := loadKustomization(t)
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml is %s %s", k.APIVersion, k.Kind)
	}
	// Every manifest in the folder is listed, and nothing else.
	files, _ := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	var onDisk []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			onDisk = append(onDisk, b)
		}
	}
	listed := slices.Clone(k.Resources)
	slices.Sort(listed)
	if !slices.Equal(onDisk, listed) {
		t.Errorf("kustomization.yaml lists %v; the folder has %v", listed, onDisk)
	}

	objs := loadManifests(t)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[reflect.TypeOf(o.obj).Elem().Name()]++
	}
	want := map[string]int{"Namespace": 1, "ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Role": 1, "RoleBinding": 1, "ConfigMap": 1, "DaemonSet": 1}
	if !reflect.DeepEqual(kinds, want) {
		t.Errorf("objects %v, want %v", kinds, want)
	}
	ns := only[*corev1.Namespace](t, objs)
	for _, o := range objs {
		m, err := metaOf(o.obj)
		if err != nil {
			t.Fatal(err)
		}
		namespaced := true
		switch o.obj.(type) {
		case *corev1.Namespace, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
			namespaced = false
		}
		if namespaced && m.GetNamespace() != ns.Name {
			t.Errorf("%s %s is in namespace %q, want %q", o.file, m.GetName(), m.GetNamespace(), ns.Name)
		}
		if !namespaced && m.GetNamespace() != "" {
			t.Errorf("%s %s is cluster-wide but names namespace %q", o.file, m.GetName(), m.GetNamespace())
		}
	}
	// The DaemonSet is privileged: Pod Security admission must allow it.
	if got := ns.Labels["pod-security.kubernetes.io/enforce"]; got != "privileged" {
		t.Errorf("namespace %s: pod-security enforce %q, want privileged", ns.Name, got)
	}
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no ObjectMeta", o)
	}
	return m, nil
}

// The decoder above must refuse what the API server would drop silently
// with a client that does not validate: an unknown or misspelt field, a
// repeated key, a value of the wrong type.
func TestStrictDecodeRefusesTypos(t *testing.T) {
	good := "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      hostPID: true\n"
	if obj, err := strictDecode([]byte(good)); err != nil || !obj.(*appsv1.DaemonSet).Spec.Template.Spec.HostPID {
		t.Fatalf("good document: %v, %v", obj, err)
	}
	for name, doc := range map[string]string{
		"misspelt field": strings.Replace(good, "hostPID", "hostPid", 1),
		"repeated key":   good + "      hostPID: false\n",
		"wrong type":     strings.Replace(good, "hostPID: true", "hostPID: yes-please", 1),
		"unknown kind":   strings.Replace(good, "DaemonSet", "DaemonSett", 1),
	} {
		if _, err := strictDecode([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
	var k kustomization
	if err := unmarshalStrict([]byte("resources: [a.yaml]\n"), &k); err != nil || len(k.Resources) != 1 {
		t.Fatalf("good kustomization: %v", err)
	}
	for _, doc := range []string{"resource: [a.yaml]\n", "Resources: [a.yaml]\n", "resources: [a.yaml]\nresources: []\n"} {
		if err := unmarshalStrict([]byte(doc), &k); err == nil {
			t.Errorf("kustomization %q decoded without error", doc)
		}
	}
}

// agentContainer returns the DaemonSet's agent container: the first of
// its containers, the other being egret keeper's (keeperContainer) when
// there is one.
func agentContainer(t testing.TB, ds *appsv1.DaemonSet) corev1.Container {
	t.Helper()
	cs := ds.Spec.Template.Spec.Containers
	if len(cs) == 0 || len(cs) > 2 || len(ds.Spec.Template.Spec.InitContainers) != 0 {
		t.Fatalf("DaemonSet has %d containers and %d init containers, want the agent (and egret keeper) and none", len(cs), len(ds.Spec.Template.Spec.InitContainers))
	}
	if cs[0].Name != "agent" || (len(cs) == 2 && cs[1].Name != "keeper") {
		t.Fatalf("DaemonSet containers %q, %q: want agent, then keeper", cs[0].Name, cs[len(cs)-1].Name)
	}
	return cs[0]
}

// keeperContainer returns the DaemonSet's egret keeper container, if any.
func keeperContainer(t testing.TB, ds *appsv1.DaemonSet) (corev1.Container, bool) {
	t.Helper()
	agentContainer(t, ds)
	cs := ds.Spec.Template.Spec.Containers
	if len(cs) < 2 {
		return corev1.Container{}, false
	}
	return cs[1], true
}

// checkKeeper checks that the agent and egret keeper meet at one socket
// on a volume both mount, and that the keeper runs as the agent's uid
// (it serves a peer of its own uid only) with no privilege at all.
func checkKeeper(t testing.TB, objs []object) {
	t.Helper()
	ctx, agentC := agentArgs(t, objs)
	ds := only[*appsv1.DaemonSet](t, objs)
	k, ok := keeperContainer(t, ds)
	if !ok {
		t.Fatal("no keeper container")
	}
	if len(k.Args) < 1 || k.Args[0] != "keeper" || len(k.Command) != 0 {
		t.Fatalf("keeper container runs %q %q, want the image's egret with keeper", k.Command, k.Args)
	}
	var sock string
	for _, a := range k.Args[1:] {
		if v, ok := strings.CutPrefix(a, "--socket="); ok {
			sock = v
		} else if a != "--log-format=json" {
			t.Errorf("keeper argument %q", a)
		}
	}
	if sock == "" || ctx.String("keeper") != sock {
		t.Fatalf("agent --keeper %q, keeper --socket %q: want the same socket", ctx.String("keeper"), sock)
	}
	mounted := func(c corev1.Container) string {
		for _, m := range c.VolumeMounts {
			if strings.HasPrefix(sock, strings.TrimSuffix(m.MountPath, "/")+"/") {
				return m.Name
			}
		}
		return ""
	}
	if va, vk := mounted(agentC), mounted(k); va == "" || va != vk {
		t.Errorf("socket %s on volume %q in the agent and %q in the keeper: want one volume both mount", sock, va, vk)
	}
	if k.Image != agentC.Image {
		t.Errorf("keeper image %s, agent image %s", k.Image, agentC.Image)
	}
	sc := k.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("keeper has no securityContext")
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("keeper is privileged")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("keeper allows privilege escalation")
	case sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0:
		t.Errorf("keeper capabilities %+v, want all dropped", sc.Capabilities)
	case sc.RunAsUser == nil || agentC.SecurityContext.RunAsUser == nil || *sc.RunAsUser != *agentC.SecurityContext.RunAsUser:
		t.Error("keeper and agent run as different uids: the keeper would refuse the agent")
	}
	if k.Resources.Limits.Memory().IsZero() {
		t.Error("keeper has no memory limit")
	}
}

func TestDaemonSetKeeper(t *testing.T) {
	checkKeeper(t, loadManifests(t))
}

// envPlaceholder stands for what the kubelet puts in a variable whose value
// comes from the pod (valueFrom).
const envPlaceholder = "node-a"

// expandArgs does the kubelet's $(VAR) expansion of a container's args with
// its env ($$ is a literal $). It returns the names referred to but not
// defined, which the kubelet would leave as written.
func expandArgs(args []string, env []corev1.EnvVar) ([]string, []string) {
	vals := map[string]string{}
	for _, e := range env {
		vals[e.Name] = e.Value
		if e.ValueFrom != nil {
			vals[e.Name] = envPlaceholder
		}
	}
	var missing []string
	ref := regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = ref.ReplaceAllStringFunc(a, func(m string) string {
			if m == "$$" {
				return "$"
			}
			name := m[2 : len(m)-1]
			if v, ok := vals[name]; ok {
				return v
			}
			missing = append(missing, name)
			return m
		})
	}
	return out, missing
}

// parseAgentArgs parses args with egret's own command line, as the binary
// in the image does, and returns the `egret agent` context without running
// the agent. An unknown flag, a bad value or a stray argument is an error.
func parseAgentArgs(args []string) (*cli.Context, error) {
	app := egretcli.App()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	app.ExitErrHandler = func(*cli.Context, error) {}
	var got *cli.Context
	// No command runs: `egret agent` records its context, every other
	// command and subcommand refuses.
	var stub func(cs []*cli.Command)
	stub = func(cs []*cli.Command) {
		for _, c := range cs {
			name := c.Name
			c.Action = func(*cli.Context) error { return fmt.Errorf("args run %s, not `egret agent`", name) }
			stub(c.Subcommands)
		}
	}
	stub(app.Commands)
	found := false
	for _, c := range app.Commands {
		if c.Name == "agent" {
			c.Action = func(c *cli.Context) error {
				got = c
				return nil
			}
			found = true
		}
	}
	if !found {
		return nil, errors.New("egret has no agent command")
	}
	if err := app.Run(append([]string{"egret"}, args...)); err != nil {
		return nil, err
	}
	if got == nil {
		return nil, fmt.Errorf("args %q do not run `egret agent`", args)
	}
	if got.NArg() > 0 {
		return nil, fmt.Errorf("stray arguments %q", got.Args().Slice())
	}
	return got, nil
}

func TestParseAgentArgsRefusesWhatEgretRefuses(t *testing.T) {
	c, err := parseAgentArgs([]string{"agent", "--grace=3s", "--metrics=:1"})
	if err != nil || c.Duration("grace") != 3*time.Second || c.String("metrics") != ":1" {
		t.Fatalf("known flags: %v", err)
	}
	for _, args := range [][]string{
		{"agent", "--no-such-flag"},
		{"agent", "--grace=soon"},
		{"agent", "--listen-port=-1"},
		{"agent", "--grace=1s", "extra"},
		{"agent", "status"},
		{"proxy"},
	} {
		if _, err := parseAgentArgs(args); err == nil {
			t.Errorf("%q parsed", args)
		}
	}
}

// agentArgs returns the DaemonSet's `egret agent` invocation, parsed.
func agentArgs(t testing.TB, objs []object) (*cli.Context, corev1.Container) {
	t.Helper()
	ds := only[*appsv1.DaemonSet](t, objs)
	c := agentContainer(t, ds)
	if len(c.Command) != 0 {
		t.Fatalf("container command %q: the image's ENTRYPOINT (/egret) must run", c.Command)
	}
	args, missing := expandArgs(c.Args, c.Env)
	if len(missing) > 0 {
		t.Fatalf("args refer to undefined variables %v (the kubelet would pass them as written)", missing)
	}
	ctx, err := parseAgentArgs(args)
	if err != nil {
		t.Fatalf("DaemonSet args %q are not a valid `egret agent` command line: %v", c.Args, err)
	}
	return ctx, c
}

func TestDaemonSetArgsAreEgretAgentFlags(t *testing.T) {
	objs := loadManifests(t)
	ctx, c := agentArgs(t, objs)
	if len(c.Args) == 0 || c.Args[0] != "agent" {
		t.Fatalf("args %q do not start with agent", c.Args)
	}
	for _, name := range []string{"kubernetes", "node-name", "policy", "metrics", "admin", "pin-dir", "grace"} {
		if !ctx.IsSet(name) {
			t.Errorf("--%s is not set", name)
		}
	}
	if !ctx.Bool("kubernetes") {
		t.Error("--kubernetes is off")
	}
	for _, banned := range []string{"pods", "cleanup", "pprof"} {
		if ctx.IsSet(banned) {
			// --cleanup would unpin every pod's state on each restart: no
			// fail-open; --pprof serves profiles to anyone reaching the port.
			t.Errorf("--%s is set on a node", banned)
		}
	}
	if got := ctx.String("node-name"); got != envPlaceholder {
		t.Errorf("--node-name is %q, want $(NODE_NAME)", got)
	}
	if got := ctx.String("log-format"); got != "json" {
		t.Errorf("--log-format %q: a cluster's log pipeline wants json", got)
	}
}

// NODE_NAME comes from the pod's spec.nodeName (the downward API): the
// agent only takes the pods of its own node.
func TestNodeNameFromDownwardAPI(t *testing.T) {
	ds := only[*appsv1.DaemonSet](t, loadManifests(t))
	c := agentContainer(t, ds)
	var n int
	for _, e := range c.Env {
		if e.Name != "NODE_NAME" {
			continue
		}
		n++
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
			t.Errorf("NODE_NAME is %+v, want valueFrom.fieldRef.fieldPath spec.nodeName", e)
		}
	}
	if n != 1 {
		t.Errorf("NODE_NAME set %d times, want once", n)
	}
}

// mountFor returns the container's mount whose path holds p (the deepest).
func mountFor(c corev1.Container, p string) (corev1.VolumeMount, bool) {
	var best corev1.VolumeMount
	found := false
	for _, m := range c.VolumeMounts {
		mp := path.Clean(m.MountPath)
		if (p == mp || strings.HasPrefix(p, mp+"/")) && (!found || len(mp) > len(best.MountPath)) {
			best, found = m, true
		}
	}
	return best, found
}

func volumeNamed(ds *appsv1.DaemonSet, name string) (corev1.Volume, bool) {
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	return corev1.Volume{}, false
}

func TestDaemonSetVolumes(t *testing.T) {
	objs := loadManifests(t)
	ds := only[*appsv1.DaemonSet](t, objs)
	ctx, c := agentArgs(t, objs)

	// Every mount names a volume, every volume is mounted, once.
	mounted := map[string]int{}
	paths := map[string]bool{}
	for _, m := range c.VolumeMounts {
		if _, ok := volumeNamed(ds, m.Name); !ok {
			t.Errorf("mount %s names no volume %q", m.MountPath, m.Name)
		}
		mounted[m.Name]++
		if paths[m.MountPath] {
			t.Errorf("two mounts at %s", m.MountPath)
		}
		paths[m.MountPath] = true
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if mounted[v.Name] != 1 {
			t.Errorf("volume %s mounted %d times, want 1", v.Name, mounted[v.Name])
		}
	}

	hostPathAt := func(mountPath string) (*corev1.HostPathVolumeSource, corev1.VolumeMount) {
		m, ok := mountFor(c, mountPath)
		if !ok || path.Clean(m.MountPath) != mountPath {
			t.Errorf("nothing mounted at %s", mountPath)
			return nil, m
		}
		v, _ := volumeNamed(ds, m.Name)
		if v.HostPath == nil {
			t.Errorf("%s is not a hostPath volume", mountPath)
		}
		return v.HostPath, m
	}

	// cgroup v2: the agent takes as its root the cgroup2 mount on top in
	// its mountinfo (internal/cgroup2). Build the container's: the
	// runtime's cgroup2 at /sys/fs/cgroup, then the volumes in order (the
	// host's cgroup2 tree is cgroup2, an emptyDir tmpfs, other binds
	// something else). The root found must be the host's whole tree,
	// read-write, and the source's --cgroup-root (if set) the same.
	var mi strings.Builder
	fmt.Fprintf(&mi, "1 0 0:1 / /sys/fs/cgroup rw - cgroup2 cgroup rw\n")
	var hostCgroup string
	for i, m := range c.VolumeMounts {
		v, _ := volumeNamed(ds, m.Name)
		fs := "ext4"
		switch {
		case v.HostPath != nil && v.HostPath.Path == "/sys/fs/cgroup":
			fs, hostCgroup = "cgroup2", path.Clean(m.MountPath)
			if m.ReadOnly {
				t.Errorf("the host's cgroup2 tree at %s is read-only", m.MountPath)
			}
		case v.EmptyDir != nil:
			fs = "tmpfs"
		}
		fmt.Fprintf(&mi, "%d 1 0:%d / %s rw - %s x rw\n", i+2, i+2, path.Clean(m.MountPath), fs)
	}
	root := cgroup2.FromMountinfo(strings.NewReader(mi.String()))
	if hostCgroup == "" || root != hostCgroup {
		t.Errorf("the agent would take %s as cgroup v2, want the host's tree (mounted at %q)", root, hostCgroup)
	}
	if r := ctx.String("cgroup-root"); ctx.IsSet("cgroup-root") && path.Clean(r) != root {
		t.Errorf("--cgroup-root %q, want %s (where the agent probes and attaches)", r, root)
	}

	// bpffs: pins outlive the pod, and a bpffs the agent mounts is the
	// node's (Bidirectional).
	if hp, m := hostPathAt(bpfload.BPFFSRoot); hp != nil {
		if hp.Path != "/sys/fs/bpf" || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
			t.Errorf("bpffs: hostPath %s propagation %s, want /sys/fs/bpf Bidirectional", hp.Path, fmtPtr(m.MountPropagation))
		}
	}
	// The pods' network namespaces as the runtime binds them, kept current
	// (HostToContainer) and never written.
	if hp, m := hostPathAt(kube.DefaultNetnsDirs[0]); hp != nil {
		if hp.Path != kube.DefaultNetnsDirs[0] || !m.ReadOnly || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer {
			t.Errorf("%s: hostPath %s read-only %v propagation %s, want the host's, read-only, HostToContainer", kube.DefaultNetnsDirs[0], hp.Path, m.ReadOnly, fmtPtr(m.MountPropagation))
		}
	}
	if m, ok := mountFor(c, path.Clean(ctx.String("pin-dir"))); !ok || m.MountPath != bpfload.BPFFSRoot {
		t.Errorf("--pin-dir %s is not on the bpffs mount", ctx.String("pin-dir"))
	}

	// The policy file is the ConfigMap's key, mounted read-only.
	cm := only[*corev1.ConfigMap](t, objs)
	pf := ctx.String("policy")
	if m, ok := mountFor(c, pf); !ok {
		t.Errorf("--policy %s is on no mount", pf)
	} else if v, _ := volumeNamed(ds, m.Name); v.ConfigMap == nil || v.ConfigMap.Name != cm.Name || !m.ReadOnly || m.SubPath != "" {
		// A subPath mount would never see the ConfigMap's updates.
		t.Errorf("--policy %s: mount %+v of volume %+v, want the whole ConfigMap %s read-only", pf, m, v, cm.Name)
	} else if _, ok := cm.Data[strings.TrimPrefix(pf, path.Clean(m.MountPath)+"/")]; !ok {
		t.Errorf("--policy %s: ConfigMap %s has no key %s", pf, cm.Name, path.Base(pf))
	}

	// The root filesystem is read-only: the admin socket and spooled bodies
	// need writable mounts.
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("root filesystem is writable")
	}
	for what, p := range map[string]string{"--admin": ctx.String("admin"), "spooled bodies (os.TempDir)": "/tmp/egret-body"} {
		m, ok := mountFor(c, p)
		if !ok || m.ReadOnly {
			t.Errorf("%s %s: on no writable mount", what, p)
			continue
		}
		if v, _ := volumeNamed(ds, m.Name); v.EmptyDir == nil {
			t.Errorf("%s %s: volume %s is not an emptyDir", what, p, v.Name)
		}
	}
}

func TestDaemonSetPodSpec(t *testing.T) {
	objs := loadManifests(t)
	ds := only[*appsv1.DaemonSet](t, objs)
	ctx, c := agentArgs(t, objs)
	spec := ds.Spec.Template.Spec

	if !labelsSelect(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) || len(ds.Spec.Selector.MatchExpressions) != 0 {
		t.Errorf("selector %v does not select the template's labels %v", ds.Spec.Selector, ds.Spec.Template.Labels)
	}
	sa := only[*corev1.ServiceAccount](t, objs)
	if spec.ServiceAccountName != sa.Name {
		t.Errorf("serviceAccountName %q, want %q", spec.ServiceAccountName, sa.Name)
	}
	if !spec.HostPID {
		t.Error("hostPID is off: the Kubernetes source finds pods' namespaces through /proc/PID/ns/net")
	}
	if spec.HostNetwork {
		t.Error("hostNetwork is on")
	}
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Error("the container is not privileged (the host's cgroup namespace comes only with privileged)")
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", spec.PriorityClassName)
	}
	everywhere := false
	for _, tol := range spec.Tolerations {
		if tol.Key == "" && tol.Operator == corev1.TolerationOpExists && tol.Effect == "" {
			everywhere = true
		}
	}
	if !everywhere {
		t.Errorf("tolerations %v do not tolerate every taint", spec.Tolerations)
	}
	// eBPF and cgroup v2: Linux nodes only (a Windows node of a mixed
	// cluster would only crash-loop it), and nothing more selective.
	if !reflect.DeepEqual(spec.NodeSelector, map[string]string{corev1.LabelOSStable: "linux"}) {
		t.Errorf("nodeSelector %v, want %s: linux alone", spec.NodeSelector, corev1.LabelOSStable)
	}

	// Shutdown: up to --grace for queued connects, then up to --grace for
	// in-flight requests; the kubelet's SIGKILL must come after both.
	grace := ctx.Duration("grace")
	if tgps := spec.TerminationGracePeriodSeconds; tgps == nil || time.Duration(*tgps)*time.Second < 2*grace+time.Second {
		t.Errorf("terminationGracePeriodSeconds %s, want at least 2 × --grace (%v) + 1s", fmtPtr(tgps), grace)
	}
	// A request under the node policy's overall timeout finishes within
	// the grace.
	pol := loadPolicy(t, objs)
	if d := pol.Defaults.Timeout; d == 0 || d > grace {
		t.Errorf("node policy timeout %v is longer than --grace %v", d, grace)
	}

	us := ds.Spec.UpdateStrategy
	if us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil {
		t.Fatalf("updateStrategy %+v", us)
	}
	if s := us.RollingUpdate.MaxSurge; s == nil || intstr.ValueOrDefault(s, intstr.FromInt32(1)).String() != "0" {
		t.Errorf("maxSurge %v: two agents on one node would share the pin directory", s)
	}
	if u := us.RollingUpdate.MaxUnavailable; u == nil {
		t.Error("maxUnavailable unset")
	} else if n, err := intstr.GetScaledValueFromIntOrPercent(u, 100, true); err != nil || n < 1 {
		t.Errorf("maxUnavailable %v: the rollout could not progress", u)
	}

	// Probes: readiness on the agent's ReadyPath, liveness on its
	// HealthPath, both served on --metrics (cmd/egret/cli serveMetrics).
	var metricsPort int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = p.ContainerPort
		}
	}
	if want := ":" + fmt.Sprint(metricsPort); metricsPort == 0 || ctx.String("metrics") != want {
		t.Errorf("--metrics %q and container port metrics %d differ", ctx.String("metrics"), metricsPort)
	}
	for name, pp := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"readiness": {c.ReadinessProbe, egretcli.ReadyPath}, "liveness": {c.LivenessProbe, egretcli.HealthPath}, "startup": {c.StartupProbe, egretcli.HealthPath}} {
		if p := pp.p; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != pp.path || p.HTTPGet.Port != intstr.FromString("metrics") {
			t.Errorf("%s probe %+v, want GET %s on port metrics", name, pp.p, pp.path)
		}
	}
	// The port serves only once the agent has loaded its programs and its
	// install watch has synced (kube.WatchInstall waits up to 30 s): the
	// startup probe gives it a minute and more before the kubelet restarts
	// it, and stands in for a liveness delay.
	if p := c.StartupProbe; p != nil && time.Duration(p.PeriodSeconds*p.FailureThreshold)*time.Second < time.Minute {
		t.Errorf("startup probe allows %ds × %d: under a minute", p.PeriodSeconds, p.FailureThreshold)
	}
	if p := c.LivenessProbe; p != nil && p.InitialDelaySeconds != 0 {
		t.Errorf("liveness initialDelaySeconds %d: the startup probe holds liveness back", p.InitialDelaySeconds)
	}
	if ann := ds.Spec.Template.Annotations; ann["prometheus.io/port"] != fmt.Sprint(metricsPort) || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("prometheus.io annotations %v do not match the metrics port %d", ann, metricsPort)
	}

	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	if !c.Resources.Limits.Cpu().IsZero() {
		t.Error("a CPU limit throttles the proxy on every request's path")
	}
}

func labelsSelect(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// loadPolicy parses the ConfigMap's policy with the real policy package.
func loadPolicy(t testing.TB, objs []object) *policy.Policy {
	t.Helper()
	cm := only[*corev1.ConfigMap](t, objs)
	if len(cm.Data) != 1 || len(cm.BinaryData) != 0 {
		t.Fatalf("ConfigMap %s has keys %v, want policy.yaml alone", cm.Name, cm.Data)
	}
	data, ok := cm.Data["policy.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no policy.yaml", cm.Name)
	}
	p, err := policy.Parse("egret-policy/policy.yaml", []byte(data))
	if err != nil {
		t.Fatalf("node policy does not load: %v", err)
	}
	return p
}

func TestPolicyIsTheEmbeddedDefaults(t *testing.T) {
	p := loadPolicy(t, loadManifests(t))
	if len(p.Upstreams) != 0 || len(p.Warnings) != 0 {
		t.Errorf("node policy has %d upstream entries and warnings %q", len(p.Upstreams), p.Warnings)
	}
	var diffs []string
	exportedDiff(reflect.ValueOf(*p.Defaults), reflect.ValueOf(*policy.Default().Defaults), "defaults", &diffs)
	exportedDiff(reflect.ValueOf(p.Direct), reflect.ValueOf(policy.Default().Direct), "direct", &diffs)
	for _, d := range diffs {
		t.Errorf("ConfigMap policy differs from the embedded defaults: %s", d)
	}
}

// exportedDiff compares the exported fields of two values of one type
// (empty and nil slices and maps are equal) and appends what differs.
func exportedDiff(a, b reflect.Value, at string, diffs *[]string) {
	switch a.Kind() {
	case reflect.Struct:
		for i := 0; i < a.NumField(); i++ {
			if f := a.Type().Field(i); f.IsExported() {
				exportedDiff(a.Field(i), b.Field(i), at+"."+f.Name, diffs)
			}
		}
	case reflect.Slice, reflect.Map:
		if a.Len() == 0 && b.Len() == 0 {
			return
		}
		fallthrough
	default:
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			*diffs = append(*diffs, fmt.Sprintf("%s = %v, embedded %v", at, a.Interface(), b.Interface()))
		}
	}
}

func TestExportedDiffFindsADifference(t *testing.T) {
	other, err := policy.Parse("x.yaml", []byte("defaults: {backoff: {max: 2s}, transient_statuses: [500]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var diffs []string
	exportedDiff(reflect.ValueOf(*other.Defaults), reflect.ValueOf(*policy.Default().Defaults), "defaults", &diffs)
	if len(diffs) != 2 || !strings.Contains(diffs[0], "Backoff.Max") || !strings.Contains(diffs[1], "TransientStatuses") {
		t.Errorf("diffs %q, want Backoff.Max and TransientStatuses", diffs)
	}
}

// The source lists and watches its node's pods and records Warning Events
// on pods whose annotations it refuses; the agent reads its own namespace
// and DaemonSet, by name, to tell an uninstall from a restart
// (kube.WatchInstall); that is all the agent may do.
func TestRBACIsWhatTheSourceNeeds(t *testing.T) {
	objs := loadManifests(t)
	role := only[*rbacv1.ClusterRole](t, objs)
	binding := only[*rbacv1.ClusterRoleBinding](t, objs)
	nsRole := only[*rbacv1.Role](t, objs)
	nsBinding := only[*rbacv1.RoleBinding](t, objs)
	sa := only[*corev1.ServiceAccount](t, objs)
	ds := only[*appsv1.DaemonSet](t, objs)

	grants := func(rules []rbacv1.PolicyRule) map[string][]string {
		got := map[string][]string{}
		for _, r := range rules {
			if len(r.NonResourceURLs) != 0 {
				t.Errorf("rule %+v: nonResourceURLs", r)
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					k := g + "/" + res
					if len(r.ResourceNames) > 0 {
						k += "/" + strings.Join(r.ResourceNames, ",")
					}
					got[k] = append(got[k], r.Verbs...)
				}
			}
		}
		for k := range got {
			slices.Sort(got[k])
			got[k] = slices.Compact(got[k])
		}
		return got
	}
	want := map[string][]string{
		"/pods":                       {"get", "list", "watch"},
		"/events":                     {"create", "patch"},
		"/namespaces/" + sa.Namespace: {"get", "list", "watch"},
		// agent/services: one informer each for the node.
		"/services":                       {"list", "watch"},
		"discovery.k8s.io/endpointslices": {"list", "watch"},
	}
	for k := range want {
		slices.Sort(want[k])
	}
	if got := grants(role.Rules); !reflect.DeepEqual(got, want) {
		t.Errorf("ClusterRole %s grants %v, want exactly %v", role.Name, got, want)
	}
	wantNS := map[string][]string{"apps/daemonsets/" + ds.Name: {"get", "list", "watch"}}
	if got := grants(nsRole.Rules); !reflect.DeepEqual(got, wantNS) {
		t.Errorf("Role %s grants %v, want exactly %v", nsRole.Name, got, wantNS)
	}
	if nsRole.Namespace != ds.Namespace {
		t.Errorf("Role in %s, the DaemonSet in %s", nsRole.Namespace, ds.Namespace)
	}
	if binding.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}) {
		t.Errorf("binding's roleRef %+v", binding.RoleRef)
	}
	if nsBinding.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: nsRole.Name}) {
		t.Errorf("role binding's roleRef %+v", nsBinding.RoleRef)
	}
	for _, subjects := range [][]rbacv1.Subject{binding.Subjects, nsBinding.Subjects} {
		if len(subjects) != 1 || subjects[0] != (rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}) {
			t.Errorf("binding's subjects %+v, want the ServiceAccount %s/%s alone", subjects, sa.Namespace, sa.Name)
		}
	}
}

// POD_NAME and POD_NAMESPACE come from the downward API: the agent finds
// its DaemonSet through its own pod.
func TestOwnPodFromDownwardAPI(t *testing.T) {
	ds := only[*appsv1.DaemonSet](t, loadManifests(t))
	c := agentContainer(t, ds)
	want := map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
	for _, e := range c.Env {
		path, ok := want[e.Name]
		if !ok {
			continue
		}
		delete(want, e.Name)
		if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path {
			t.Errorf("%s is %+v, want valueFrom.fieldRef.fieldPath %s", e.Name, e, path)
		}
	}
	if len(want) > 0 {
		t.Errorf("not set: %v", want)
	}
}

// imageRepo is where egret's image is published.
const imageRepo = "ghcr.io/egret-proxy/egret"

func TestImageAndContainerfile(t *testing.T) {
	objs := loadManifests(t)
	c := agentContainer(t, only[*appsv1.DaemonSet](t, objs))
	repo, tag, ok := strings.Cut(c.Image, ":")
	if !ok || repo != imageRepo || tag == "" || tag == "latest" {
		t.Errorf("image %q, want %s:<release tag>", c.Image, imageRepo)
	}
	k := loadKustomization(t)
	if len(k.Images) != 1 || k.Images[0].Name != imageRepo || k.Images[0].NewTag != tag || k.Images[0].NewName != "" {
		t.Errorf("kustomization images %+v, want %s with tag %s", k.Images, imageRepo, tag)
	}
	if c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("imagePullPolicy %q: a node restarting its agent should not need the registry", c.ImagePullPolicy)
	}

	stages, err := parseContainerfile("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	last := stages[len(stages)-1]
	if !strings.HasPrefix(last.from, "gcr.io/distroless/static") {
		t.Errorf("final stage FROM %s, want distroless static", last.from)
	}
	if last.entrypoint != `["/egret"]` {
		t.Errorf("final stage ENTRYPOINT %s, want [\"/egret\"] (the DaemonSet passes args only)", last.entrypoint)
	}
	// The final stage copies a binary that some stage built from
	// ./cmd/egret without cgo.
	built := false
	for _, s := range stages {
		for _, r := range s.runs {
			if strings.Contains(r, "go build") && strings.Contains(r, "./cmd/egret") {
				built = s.env["CGO_ENABLED"] == "0" || strings.Contains(r, "CGO_ENABLED=0")
			}
		}
	}
	if !built {
		t.Error("no stage builds ./cmd/egret with CGO_ENABLED=0")
	}
}

type stage struct {
	from, entrypoint string
	runs             []string
	env              map[string]string
}

// parseContainerfile reads the instructions the test checks (FROM, ENV,
// RUN, ENTRYPOINT) stage by stage; ENV inherits from a FROM of an
// earlier stage.
func parseContainerfile(file string) ([]stage, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var stages []stage
	named := map[string]int{}
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		if strings.ToUpper(instr) == "FROM" {
			f := strings.Fields(rest)
			s := stage{from: f[0], env: map[string]string{}}
			if i, ok := named[f[0]]; ok {
				for k, v := range stages[i].env {
					s.env[k] = v
				}
			}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				named[f[2]] = len(stages)
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			continue
		}
		s := &stages[len(stages)-1]
		switch strings.ToUpper(instr) {
		case "ENV":
			for _, kv := range strings.Fields(rest) {
				if k, v, ok := strings.Cut(kv, "="); ok {
					s.env[k] = v
				}
			}
		case "RUN":
			s.runs = append(s.runs, rest)
		case "ENTRYPOINT":
			s.entrypoint = rest
		}
	}
	if len(stages) == 0 {
		return nil, fmt.Errorf("%s: no FROM", file)
	}
	return stages, nil
}

// fmtPtr prints what p points to, or "unset".
func fmtPtr[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// The demo's manifests decode as strictly; its client is opted in and its
// upstream is the image the Containerfile's ledger stage builds.
func TestDemoManifests(t *testing.T) {
	data, err := os.ReadFile("demo/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs, err := splitDocs(data)
	if err != nil {
		t.Fatal(err)
	}
	optedIn := 0
	for i, d := range docs {
		obj, err := strictDecode(d)
		if err != nil {
			t.Fatalf("demo.yaml, document %d: %v", i+1, err)
		}
		if p, ok := obj.(*corev1.Pod); ok && p.Annotations["egret.dev/enabled"] == "true" {
			optedIn++
		}
	}
	if optedIn != 1 {
		t.Errorf("%d opted-in pods in the demo, want 1", optedIn)
	}
	stages, err := parseContainerfile("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	ledger := false
	for _, s := range stages {
		ledger = ledger || s.entrypoint == `["/ledger"]`
	}
	if !ledger {
		t.Error("the Containerfile has no ledger stage for the demo")
	}
}
