//go:build linux

package cgroup2

import (
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const unified = `22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
29 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
30 22 0:27 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:10 - bpf bpf rw,mode=700
`

const hybrid = `25 22 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
`

// A container: the runtime's cgroup2 at /sys/fs/cgroup, a volume over it,
// the host's cgroup2 below that.
const covered = `50 40 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup rw
51 50 0:31 / /sys/fs/cgroup rw - tmpfs tmpfs rw
52 51 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
`

const elsewhere = `40 1 0:40 / /run/my\040cgroups rw,relatime - cgroup2 none rw
41 1 0:41 /kubepods /host/cgroup rw,relatime - cgroup2 cgroup2 rw
`

func TestPick(t *testing.T) {
	for _, c := range []struct{ name, info, want string }{
		{"unified", unified, "/sys/fs/cgroup"},
		{"hybrid", hybrid, "/sys/fs/cgroup/unified"},
		{"elsewhere, escaped", elsewhere, "/run/my cgroups"},
		{"covered", covered, "/sys/fs/cgroup/unified"},
		{"all covered", "1 0 0:1 / /sys/fs/cgroup rw - cgroup2 c rw\n2 1 0:2 / /sys/fs/cgroup rw - tmpfs t rw\n", Default},
		{"none", "22 28 0:21 / /sys rw - sysfs sysfs rw\n", Default},
		{"garbage", "no separator here\n - \n1 2 3 - cgroup2\n", Default},
	} {
		if got := pick(mounts(strings.NewReader(c.info))); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	// A point counts by its top mount: cgroup2 mounted again over the tmpfs.
	if got := mounts(strings.NewReader(hybrid + unified)); !slices.Equal(got, []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
		t.Errorf("mounts %q", got)
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/a\040b`: "/a b", `/t\011x`: "/t\tx", `/b\134s`: `/b\s`, `/plain`: "/plain", `/odd\04`: `/odd\04`, `/x\089`: `/x\089`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// On this machine Root is a real cgroup2 mount.
func TestRootIsCgroup2(t *testing.T) {
	r := Root()
	var st unix.Statfs_t
	if err := unix.Statfs(r, &st); err != nil {
		t.Fatalf("%s: %v", r, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Fatalf("%s is not cgroup2 (type %#x)", r, st.Type)
	}
	if _, err := os.Stat(r + "/cgroup.procs"); err != nil {
		t.Fatal(err)
	}
}
