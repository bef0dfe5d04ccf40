package bpftest

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// v1Hierarchy returns the mount point of a cgroup v1 hierarchy, or "".
func v1Hierarchy(t *testing.T) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, _ := strings.Cut(sc.Text(), " - ")
		if f, g := strings.Fields(pre), strings.Fields(post); len(f) > 4 && len(g) > 0 && g[0] == "cgroup" {
			return f[4]
		}
	}
	return ""
}

// A cgroup v1 tree (what the kubelet of test/kubenode makes beside the v2
// one on a hybrid host) is removed too: it has no cgroup.events, which
// cgroup2.Remove takes for the directory's absence, so that
// RemoveCgroupTree used to leave every v1 directory behind.
func TestRemoveCgroupTreeV1(t *testing.T) {
	testenv.RequireRoot(t)
	root := v1Hierarchy(t)
	if root == "" {
		t.Skip("no cgroup v1 hierarchy on this host: nothing to remove there")
	}
	top := filepath.Join(root, RandName())
	t.Cleanup(func() { os.Remove(filepath.Join(top, "a", "b")); os.Remove(filepath.Join(top, "a")); os.Remove(top) })
	if err := os.MkdirAll(filepath.Join(top, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := RemoveCgroupTree(top); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(top); !os.IsNotExist(err) {
		t.Fatalf("%s still there after RemoveCgroupTree: %v", top, err)
	}
}
