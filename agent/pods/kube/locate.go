package kube

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Driver is the kubelet's cgroup driver, which decides the names of the
// pods' cgroups.
type Driver string

// Cgroup drivers.
const (
	// DriverAuto takes whichever layout exists for the pod.
	DriverAuto Driver = "auto"
	// DriverCgroupfs: kubepods/burstable/pod<uid>.
	DriverCgroupfs Driver = "cgroupfs"
	// DriverSystemd: kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice.
	DriverSystemd Driver = "systemd"
)

// ParseDriver reads a driver name ("" is DriverAuto).
func ParseDriver(s string) (Driver, error) {
	switch d := Driver(s); d {
	case "":
		return DriverAuto, nil
	case DriverAuto, DriverCgroupfs, DriverSystemd:
		return d, nil
	}
	return "", fmt.Errorf("%w: cgroup driver %q: auto, cgroupfs or systemd", ErrConfig, s)
}

// CgroupPaths returns the directories, below root, that the kubelet gives
// a pod's cgroup with driver (both layouts for DriverAuto, cgroupfs
// first). kubeletRoot is the kubelet's --cgroup-root ("" or "/" for
// none). An empty qos (status not set yet) gives each class's path.
func CgroupPaths(root, kubeletRoot string, driver Driver, uid types.UID, qos corev1.PodQOSClass) []string {
	var prefix []string
	for _, c := range strings.Split(kubeletRoot, "/") {
		if c != "" {
			prefix = append(prefix, c)
		}
	}
	classes := []corev1.PodQOSClass{qos}
	if qos == "" {
		classes = []corev1.PodQOSClass{corev1.PodQOSGuaranteed, corev1.PodQOSBurstable, corev1.PodQOSBestEffort}
	}
	var out []string
	for _, class := range classes {
		// The kubelet's cgroup name: [--cgroup-root..., kubepods, qos, pod<uid>]
		// (Guaranteed pods sit directly under kubepods).
		name := append(slices.Clone(prefix), "kubepods")
		switch class {
		case corev1.PodQOSBurstable:
			name = append(name, "burstable")
		case corev1.PodQOSBestEffort:
			name = append(name, "besteffort")
		}
		name = append(name, "pod"+string(uid))
		if driver != DriverSystemd {
			out = append(out, filepath.Join(append([]string{root}, name...)...))
		}
		if driver != DriverCgroupfs {
			out = append(out, filepath.Join(root, systemdPath(name)))
		}
	}
	return out
}

// systemdPath turns a kubelet cgroup name into systemd's slice hierarchy:
// each level is a slice named by the components so far joined with "-",
// dashes inside a component becoming underscores (a UID's dashes, too).
// [kubepods burstable pod1-2] -> kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice
func systemdPath(name []string) string {
	var dirs []string
	var unit string
	for _, c := range name {
		c = strings.ReplaceAll(strings.TrimSuffix(c, ".slice"), "-", "_")
		if unit == "" {
			unit = c
		} else {
			unit += "-" + c
		}
		dirs = append(dirs, unit+".slice")
	}
	return filepath.Join(dirs...)
}

// locateCgroup returns the first of the pod's candidate cgroups that
// exists.
func (s *Source) locateCgroup(pod *corev1.Pod) (string, error) {
	cands := CgroupPaths(s.cfg.CgroupRoot, s.cfg.KubeletCgroupRoot, s.cfg.Driver, pod.UID, pod.Status.QOSClass)
	for _, c := range cands {
		if fi, err := os.Stat(c); err == nil && fi.IsDir() {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w: pod %s (uid %s, %s): none of %s", ErrCgroupNotFound, PodName(pod), pod.UID,
		orUnknown(pod.Status.QOSClass), strings.Join(cands, ", "))
}

func orUnknown(q corev1.PodQOSClass) string {
	if q == "" {
		return "QoS class unknown"
	}
	return string(q)
}

// nsID identifies a namespace file: the namespace's inode on nsfs.
type nsID struct{ dev, ino uint64 }

func statNS(path string) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nsID{}, err
	}
	return nsID{dev: st.Dev, ino: st.Ino}, nil
}

// locateNetns finds the network namespace of the pod whose cgroup is
// cgroup, from a process in the cgroup's tree: the sandbox's pause process
// if there is one (it lives as long as the pod), else the oldest. The
// reference returned is a bind mount of the same namespace in one of
// NetnsDirs when there is one (it outlives any process: CRI runtimes keep
// one per pod sandbox), else /proc/PID/ns/net.
func (s *Source) locateNetns(podName, cgroup string) (string, nsID, error) {
	pid, err := sandboxProcess(procRoot, cgroup)
	if err != nil {
		return "", nsID{}, fmt.Errorf("%w: pod %s: %v", ErrNetnsNotFound, podName, err)
	}
	procPath := filepath.Join(procRoot, strconv.Itoa(pid), "ns", "net")
	id, err := statNS(procPath)
	if err != nil {
		return "", nsID{}, fmt.Errorf("%w: pod %s: process %d: %v", ErrNetnsNotFound, podName, pid, err)
	}
	if id == s.hostNS {
		// The pod's sandbox has not made its namespace yet, or this is
		// not the pod's process: listening here would be the node's
		// namespace.
		return "", nsID{}, fmt.Errorf("%w: pod %s: process %d is in the agent's own network namespace", ErrNetnsNotFound, podName, pid)
	}
	for _, dir := range s.cfg.NetnsDirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			if nid, err := statNS(p); err == nil && nid == id {
				return p, id, nil
			}
		}
	}
	return procPath, id, nil
}

// sandboxProcess picks the process of the cgroup tree whose namespace
// names the pod's: one called "pause" (the sandbox), else the one started
// first (of two started in the same clock tick, the lower pid).
func sandboxProcess(procRoot, cgroup string) (int, error) {
	var pids []int
	err := filepath.WalkDir(cgroup, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == cgroup {
				return err
			}
			return nil // a container cgroup that went meanwhile
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if pid, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil && pid > 0 {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if len(pids) == 0 {
		// Also what an agent without the host's PID namespace sees: the
		// pods' processes are not in its /proc.
		return 0, errors.New("no process in " + cgroup + " or below it yet (or none visible: the agent needs hostPID)")
	}
	best, bestStart := 0, uint64(0)
	for _, pid := range pids {
		comm, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "comm"))
		if err != nil {
			continue // exited
		}
		if strings.TrimSpace(string(comm)) == "pause" {
			return pid, nil
		}
		start, err := startTime(procRoot, pid)
		if err != nil {
			continue
		}
		if best == 0 || start < bestStart || start == bestStart && pid < best {
			best, bestStart = pid, start
		}
	}
	if best == 0 {
		return 0, errors.New("the processes in " + cgroup + " exited")
	}
	return best, nil
}

// startTime is field 22 of /proc/PID/stat: when the process started, in
// clock ticks after boot.
func startTime(procRoot string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The command (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("bad stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 {
		return 0, errors.New("bad stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}
