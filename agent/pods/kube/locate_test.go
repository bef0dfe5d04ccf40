package kube

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

const uid = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"

func TestCgroupPathsAreTheKubelets(t *testing.T) {
	cases := []struct {
		driver      Driver
		kubeletRoot string
		qos         corev1.PodQOSClass
		want        []string
	}{
		{DriverCgroupfs, "", corev1.PodQOSGuaranteed, []string{"/cg/kubepods/pod" + uid}},
		{DriverCgroupfs, "/", corev1.PodQOSBurstable, []string{"/cg/kubepods/burstable/pod" + uid}},
		{DriverCgroupfs, "", corev1.PodQOSBestEffort, []string{"/cg/kubepods/besteffort/pod" + uid}},
		{DriverCgroupfs, "/k8s/nodes", corev1.PodQOSBurstable, []string{"/cg/k8s/nodes/kubepods/burstable/pod" + uid}},
		{DriverSystemd, "", corev1.PodQOSGuaranteed, []string{
			"/cg/kubepods.slice/kubepods-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice"}},
		{DriverSystemd, "/", corev1.PodQOSBurstable, []string{
			"/cg/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice"}},
		{DriverSystemd, "", corev1.PodQOSBestEffort, []string{
			"/cg/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice"}},
		{DriverSystemd, "/kubelet.slice", corev1.PodQOSBestEffort, []string{
			"/cg/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice"}},
		{DriverAuto, "", corev1.PodQOSBurstable, []string{
			"/cg/kubepods/burstable/pod" + uid,
			"/cg/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice"}},
		{DriverCgroupfs, "", "", []string{
			"/cg/kubepods/pod" + uid, "/cg/kubepods/burstable/pod" + uid, "/cg/kubepods/besteffort/pod" + uid}},
	}
	for _, c := range cases {
		got := CgroupPaths("/cg", c.kubeletRoot, c.driver, uid, c.qos)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s %q %s:\n got %q\nwant %q", c.driver, c.kubeletRoot, c.qos, got, c.want)
		}
	}
}

func TestParseDriver(t *testing.T) {
	for _, s := range []string{"", "auto", "cgroupfs", "systemd"} {
		if _, err := ParseDriver(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	if _, err := ParseDriver("docker"); !errors.Is(err, ErrConfig) {
		t.Errorf("docker: %v", err)
	}
}

// The cgroup is found under either driver's layout when the driver is
// auto, and only under its own otherwise (plain directories stand in for
// the cgroup tree).
func TestLocateCgroupByDriver(t *testing.T) {
	root := t.TempDir()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: uid}}
	pod.Status.QOSClass = corev1.PodQOSBurstable
	systemd := filepath.Join(root, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice")
	if err := os.MkdirAll(systemd, 0o755); err != nil {
		t.Fatal(err)
	}
	src := func(d Driver) *Source {
		s, err := New(Config{Client: unusedClient(), NodeName: "n", CgroupRoot: root, Driver: d})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, d := range []Driver{DriverAuto, DriverSystemd} {
		if got, err := src(d).locateCgroup(pod); err != nil || got != systemd {
			t.Errorf("%s: %q %v", d, got, err)
		}
	}
	_, err := src(DriverCgroupfs).locateCgroup(pod)
	if !errors.Is(err, ErrCgroupNotFound) {
		t.Fatalf("cgroupfs: %v, want ErrCgroupNotFound", err)
	}
	t.Logf("%v", err)
}

func TestNewChecksConfig(t *testing.T) {
	for _, c := range []Config{
		{NodeName: "n"},
		{Client: unusedClient()},
		{Client: unusedClient(), NodeName: "n", Driver: "docker"},
		{Client: unusedClient(), NodeName: "n", CgroupRoot: "/nonexistent-egret"},
	} {
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", c, err)
		}
	}
}

// The sandbox process is the one called pause, else the oldest.
func TestSandboxProcess(t *testing.T) {
	dir := t.TempDir()
	start := func(name string) int {
		t.Helper()
		bin := filepath.Join(dir, name)
		if err := os.Symlink("/bin/sleep", bin); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}
	older := start("app")
	time.Sleep(30 * time.Millisecond) // not synchronisation: start times count clock ticks (10 ms); the two must differ
	newer := start("sidecar")
	// A fake cgroup tree: cgroup.procs files in a pod dir and a container dir.
	cg := filepath.Join(dir, "pod")
	if err := os.MkdirAll(filepath.Join(cg, "ctr"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(path string, pids ...int) {
		var b []byte
		for _, p := range pids {
			b = strconv.AppendInt(b, int64(p), 10)
			b = append(b, '\n')
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(cg, "cgroup.procs"))
	write(filepath.Join(cg, "ctr", "cgroup.procs"), newer, older)
	if got, err := sandboxProcess(procRoot, cg); err != nil || got != older {
		t.Fatalf("oldest: got %d %v, want %d", got, err, older)
	}
	pause := start("pause")
	write(filepath.Join(cg, "cgroup.procs"), pause)
	if got, err := sandboxProcess(procRoot, cg); err != nil || got != pause {
		t.Fatalf("pause: got %d %v, want %d", got, err, pause)
	}
	write(filepath.Join(cg, "cgroup.procs"))
	write(filepath.Join(cg, "ctr", "cgroup.procs"))
	if _, err := sandboxProcess(procRoot, cg); err == nil {
		t.Fatal("no process: no error")
	}
}

// unusedClient is a clientset that is never asked anything (Config checks).
func unusedClient() rest.Interface {
	c, err := NewClient(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		panic(err)
	}
	return c
}
