package imagebuild

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
	"github.com/egret-proxy/egret/internal/ociimage"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// TestImageIndexInContainerd: the archive TestImageIndex inspects is
// loadable by containerd as a node would load it without a registry. A
// containerd of the test's own (Debian's, temp root, state and socket,
// in a mount namespace of its own) imports it with `ctr images import
// --all-platforms`; ctr then lists the image under its name with the
// index's digest and both platforms, holds every blob of the archive (the
// index, each platform's manifest, config and layer) byte for byte, calls
// the node's platform complete, and `ctr run --rm` (runc) of that
// platform runs /egret --version, which prints the version built. The
// test removes all it made (containerd clean-up: stop).
func TestImageIndexInContainerd(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles egret twice")
	}
	testenv.RequireRoot(t)
	for _, c := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "unshare", "nsenter", "umount"} {
		_, err := exec.LookPath(c)
		testenv.Require(t, err == nil, c+" (apt-get install containerd runc util-linux)")
	}
	archive, digest := testIndex(t)
	l := readLayout(t, archive)

	c := startContainerd(t)
	start := time.Now()
	if out, err := c.ctr("images", "import", "--all-platforms", archive); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("ctr images import --all-platforms: %.1fs\n%s", time.Since(start).Seconds(), out)
	}

	blobs, err := archiveBlobs(archive)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + 3*len(DefaultPlatforms); len(blobs) != want {
		t.Errorf("the archive has %d blobs, want %d (the index, and a manifest, a config and a layer per platform)", len(blobs), want)
	}
	for _, p := range l.Platforms {
		if _, ok := blobs[p.Digest]; !ok {
			t.Errorf("%s/%s: manifest %s not in the archive", p.OS, p.Architecture, p.Digest)
		}
	}
	c.expectImage(t, l.Name, digest, blobs)
	t.Logf("ctr content: all %d blobs of the archive", len(blobs))

	// ctr images check: REF TYPE DIGEST STATUS SIZE UNPACKED, the status
	// "complete (N/N)" when every blob of the node's platform is there.
	out, err := c.ctr("images", "check")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ctr images check:\n%s", out)
	if row := findRow(out, l.Name); len(row) < 5 || row[3] != "complete" {
		t.Errorf("ctr images check: %s is not complete:\n%s", l.Name, out)
	}

	// The node's platform's image runs under runc. The arguments replace
	// the entrypoint (ctr run's COMMAND), so /egret is named.
	start = time.Now()
	got, err := c.ctrBytes("run", "--rm", "--platform", "linux/"+runtime.GOARCH,
		"--cgroup", "/"+c.ns+"/version", l.Name, "version", "/egret", "--version")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ctr run --rm %s /egret --version: %.1fs: %s", l.Name, time.Since(start).Seconds(), got)
	if re := versionLine(testTag, runtime.GOARCH); !re.Match(got) {
		t.Errorf("ctr run /egret --version printed %q, want %v", got, re)
	}
	if out, err := c.ctr("containers", "ls", "-q"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("ctr run --rm left containers: %q %v", out, err)
	}
}

// expectImage checks that containerd lists ref as the index digest with
// every default platform, and holds each of blobs (by digest) byte for
// byte in its content store.
func (c *containerd) expectImage(t *testing.T, ref, digest string, blobs map[string][]byte) {
	t.Helper()
	// ctr images ls: REF TYPE DIGEST SIZE PLATFORMS LABELS.
	out, err := c.ctr("images", "ls")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ctr images ls:\n%s", out)
	row := findRow(out, ref)
	if len(row) < 6 {
		t.Fatalf("ctr images ls has no image %s:\n%s", ref, out)
	}
	if row[1] != ociimage.MediaIndex || row[2] != digest {
		t.Errorf("ctr images ls: %s is %s %s, want the index %s", ref, row[1], row[2], digest)
	}
	if got := strings.Split(row[5], ","); !slices.Equal(got, DefaultPlatforms) {
		t.Errorf("ctr images ls: %s has platforms %q, want %q", ref, got, DefaultPlatforms)
	}
	if out, err = c.ctr("content", "ls", "-q"); err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, d := range strings.Fields(out) {
		held[d] = true
	}
	for d, want := range blobs {
		if !held[d] {
			t.Errorf("ctr content ls has no %s (%d bytes)", d, len(want))
			continue
		}
		got, err := c.ctrBytes("content", "get", d)
		if err != nil {
			t.Error(err)
		} else if !bytes.Equal(got, want) {
			t.Errorf("ctr content get %s: %d bytes, not the archive's %d", d, len(got), len(want))
		}
	}
}

// archiveBlobs returns the blobs of an OCI layout archive by digest.
func archiveBlobs(path string) (map[string][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	blobs := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return blobs, nil
		}
		if err != nil {
			return nil, err
		}
		sum, ok := strings.CutPrefix(h.Name, "blobs/sha256/")
		if !ok || h.Typeflag != tar.TypeReg {
			continue
		}
		if blobs["sha256:"+sum], err = io.ReadAll(tr); err != nil {
			return nil, err
		}
	}
}

// findRow returns the fields of the line of a ctr table whose first field
// is ref.
func findRow(table, ref string) []string {
	sc := bufio.NewScanner(strings.NewReader(table))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 && f[0] == ref {
			return f
		}
	}
	return nil
}

// containerd is a throwaway containerd: its root, state, sockets and
// config in a temp directory, its /run (runc's state, the shims' sockets
// and ctr's FIFOs go to /run/containerd whatever the config says) a tmpfs
// in a mount namespace of its own, held by a sleeping process; its
// containers' cgroups under /<ns>/ of each hierarchy.
type containerd struct {
	dir    string
	sock   string
	ns     string // containerd namespace, and the cgroup its containers go under
	holder *exec.Cmd
	daemon *exec.Cmd
	log    string

	holderExited, daemonExited <-chan struct{}
}

// startContainerd starts a containerd and registers its removal: its
// containers, its processes, its mounts, its cgroups and its directory.
func startContainerd(t *testing.T) *containerd {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	c := &containerd{dir: t.TempDir(), ns: "egret-ctrtest-" + hex.EncodeToString(b)}
	c.sock = filepath.Join(c.dir, "run", "containerd.sock")
	c.log = filepath.Join(c.dir, "containerd.log")
	// Registered after t.TempDir's removal, so run before it.
	t.Cleanup(func() { c.stop(t) })
	for _, d := range []string{"root", "state", "run"} {
		if err := os.Mkdir(filepath.Join(c.dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}

	logf, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// The holder says "ready" on a pipe once /run is its own.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c.holder = exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		"set -e\nmount -t tmpfs -o mode=0755 tmpfs /run\nmkdir /run/containerd\necho ready\nexec sleep infinity")
	c.holder.Stdout, c.holder.Stderr = w, logf
	// The namespace goes with the test binary, should that be killed.
	c.holder.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = c.holder.Start()
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { c.holder.Wait(); close(exited) }()
	c.holderExited = exited
	if line, err := bufio.NewReader(r).ReadString('\n'); line != "ready\n" {
		t.Fatalf("the mount namespace did not come up: %q %v: %s", line, err, c.logTail())
	}

	// Only what is needed: where it keeps things and listens; no CRI
	// (no kubelet here), no /opt plugin (it would make /opt/containerd).
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt"]
[grpc]
  address = %q
`, filepath.Join(c.dir, "root"), filepath.Join(c.dir, "state"), c.sock)
	confPath := filepath.Join(c.dir, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	c.daemon = exec.Command("nsenter", "--target", strconv.Itoa(c.holder.Process.Pid), "--mount", "--",
		"containerd", "--config", confPath)
	c.daemon.Stdout, c.daemon.Stderr = logf, logf
	c.daemon.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.daemon.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { c.daemon.Wait(); close(done) }()
	c.daemonExited = done
	start := time.Now()
	// Polls containerd's API (another process's state).
	var last error
	if !testenv.Poll(60*time.Second, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		_, last = c.ctr("version")
		return last == nil
	}) || last != nil {
		t.Fatalf("containerd did not answer: %v\n%s", last, c.logTail())
	}
	t.Logf("containerd up in %.1fs (namespace %s)", time.Since(start).Seconds(), c.ns)
	return c
}

// ctr runs ctr in containerd's mount namespace (ctr's FIFOs are under
// its /run/containerd) against its socket, in the test's namespace, and
// returns its output.
func (c *containerd) ctr(args ...string) (string, error) {
	b, err := c.ctrBytes(args...)
	return string(b), err
}

func (c *containerd) ctrBytes(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	all := append([]string{"--target", strconv.Itoa(c.holder.Process.Pid), "--mount", "--",
		"ctr", "-a", c.sock, "-n", c.ns}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", all...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %v: %s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out, nil
}

func (c *containerd) logTail() string {
	b, _ := os.ReadFile(c.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

// stop removes what the containerd made: its containers (killed, their
// cgroups removed by runc), containerd itself, any process left in its
// mount namespace (a shim), every mount in that namespace under the temp
// directory (a container's rootfs) and its /run, the namespace, and the
// cgroups under /<ns>/. It checks that no mount under the directory is
// left on the host and no cgroup; t.TempDir then removes the directory.
func (c *containerd) stop(t *testing.T) {
	if t.Failed() && c.log != "" {
		t.Logf("containerd log (last lines):\n%s", c.logTail())
	}
	if c.holder == nil || c.holder.Process == nil {
		return
	}
	var errs []error
	if c.daemon != nil && c.daemon.Process != nil && !c.gone(c.daemonExited) {
		if out, err := c.ctr("containers", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				// The task is killed and deleted, if there is one.
				if _, err := c.ctr("tasks", "delete", "--force", id); err != nil && !strings.Contains(err.Error(), "not found") {
					errs = append(errs, err)
				}
				if _, err := c.ctr("containers", "delete", id); err != nil {
					errs = append(errs, err)
				}
			}
		} else {
			errs = append(errs, err)
		}
		_ = c.daemon.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.daemonExited:
		case <-time.After(15 * time.Second):
			errs = append(errs, errors.New("containerd did not exit on SIGTERM within 15 s: killed"))
			_ = c.daemon.Process.Kill()
			<-c.daemonExited
		}
	}
	holder := c.holder.Process.Pid
	if c.gone(c.holderExited) {
		// Never came up: nothing of the namespace to remove.
	} else if err := killNamespace(holder); err != nil {
		errs = append(errs, err)
	} else {
		// The namespace's mounts under the directory (a container's
		// rootfs), innermost first, then its /run, while the holder keeps
		// the namespace.
		mounts := mountsUnder(fmt.Sprintf("/proc/%d/mountinfo", holder), c.dir)
		slices.Reverse(mounts)
		for _, m := range append(mounts, "/run") {
			if out, err := exec.Command("nsenter", "--target", strconv.Itoa(holder), "--mount", "--", "umount", m).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("umount %s: %v: %s", m, err, out))
			}
		}
	}
	if !c.gone(c.holderExited) {
		_ = c.holder.Process.Kill()
		<-c.holderExited
	}
	if m := mountsUnder("/proc/self/mountinfo", c.dir); len(m) > 0 {
		errs = append(errs, fmt.Errorf("mounts left on the host: %q", m))
	}
	// runc removed each container's cgroup when its task was deleted;
	// /<ns>/ is left in each hierarchy, empty. A container cgroup still
	// there is an error (its processes are killed and it is removed all
	// the same).
	tops, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", c.ns))
	if d := filepath.Join("/sys/fs/cgroup", c.ns); exists(d) {
		tops = append(tops, d)
	}
	for _, d := range tops {
		if ents, _ := os.ReadDir(d); slices.ContainsFunc(ents, os.DirEntry.IsDir) {
			errs = append(errs, fmt.Errorf("a container's cgroup left under %s", d))
		}
		if err := bpftest.RemoveCgroupTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Errorf("removing the test's containerd: %v", err)
	}
}

func (c *containerd) gone(exited <-chan struct{}) bool {
	select {
	case <-exited:
		return true
	default:
		return false
	}
}

// killNamespace kills every process in the holder's mount namespace but
// the holder (a shim outliving containerd) and waits until none is left.
func killNamespace(holder int) error {
	want, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", holder))
	if err != nil {
		return err
	}
	self, _ := os.Readlink("/proc/self/ns/mnt")
	if want == self {
		return errors.New("the holder is in the test's own mount namespace")
	}
	// Polls /proc (a killed process is reaped by its parent, with no
	// event here).
	if testenv.Poll(10*time.Second, func() bool {
		ents, _ := os.ReadDir("/proc")
		left := 0
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == holder {
				continue
			}
			if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && ns == want {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				left++
			}
		}
		return left == 0
	}) {
		return nil
	}
	return errors.New("processes of containerd's mount namespace survive SIGKILL")
}

// mountsUnder returns the mount points of a mountinfo file that are dir
// or under it, in the file's order (parents first).
func mountsUnder(mountinfo, dir string) []string {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		if p := unescapeMountinfo(f[4]); p == dir || strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	return out
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
