// Package cgroup2 finds where the cgroup v2 hierarchy is mounted.
//
// On a node with the unified hierarchy only (systemd's default since v247,
// every current distribution and kubeadm cluster) it is /sys/fs/cgroup; on
// a hybrid one (cgroup v1 controllers beside v2, like this project's test
// machines) it is /sys/fs/cgroup/unified. Egret's eBPF programs attach to
// cgroup v2 directories, so every path egret builds starts at Root.
package cgroup2

import (
	"bufio"
	"io"
	"os"
	"strings"
	"sync"
)

// Default is the answer when no cgroup2 mount is found (the caller's check
// of the mount then says so) and the usual path on a unified node.
const Default = "/sys/fs/cgroup"

// Root returns the cgroup v2 mount point seen by this process: /sys/fs/cgroup
// if cgroup2 is mounted there, else /sys/fs/cgroup/unified if it is mounted
// there, else the first cgroup2 mount listed in /proc/self/mountinfo, else
// Default. A mount point covered by a later mount of another kind (a
// container's runtime mounts its cgroup2 at /sys/fs/cgroup, then a volume
// over it) does not count. The answer is read once.
func Root() string {
	rootOnce.Do(func() {
		root = Default
		f, err := os.Open("/proc/self/mountinfo")
		if err != nil {
			return
		}
		defer f.Close()
		root = pick(mounts(f))
	})
	return root
}

var (
	rootOnce sync.Once
	root     string
)

// FromMountinfo is Root's choice for a /proc/PID/mountinfo listing: what a
// process with those mounts (a container's, say) takes as cgroup v2.
func FromMountinfo(r io.Reader) string { return pick(mounts(r)) }

// pick chooses among cgroup2 mount points as Root says.
func pick(points []string) string {
	for _, want := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		for _, p := range points {
			if p == want {
				return p
			}
		}
	}
	if len(points) > 0 {
		return points[0]
	}
	return Default
}

// mounts returns the mount points of the cgroup2 file systems in a
// mountinfo listing (proc(5): the fifth field is the mount point, the
// file system type follows the " - " separator; octal escapes such as
// \040 stand for spaces), in the listing's order, leaving out a point whose
// last mount (the one on top) is of another kind.
func mounts(r io.Reader) []string {
	var order []string
	top := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		fs, _, _ := strings.Cut(post, " ")
		f := strings.Fields(pre)
		if len(f) < 5 {
			continue
		}
		point := unescape(f[4])
		if _, seen := top[point]; !seen {
			order = append(order, point)
		}
		top[point] = fs
	}
	var out []string
	for _, p := range order {
		if top[p] == "cgroup2" {
			out = append(out, p)
		}
	}
	return out
}

// unescape undoes mountinfo's octal escapes (\040 space, \011 tab, \012
// newline, \134 backslash).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
