package bpfload

import (
	"errors"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/internal/cgroup2"
)

// Feature is one kernel feature the agent uses, as `egret status` shows it.
type Feature struct {
	// Name is the kernel's name for it (BPF_PROG_TYPE_..., a path).
	Name string `json:"name"`
	// Use is what egret does with it.
	Use string `json:"use"`
	// Since is the first Linux release that has it, for older kernels.
	Since string `json:"since"`
	// Available says the running kernel has it; Error why not ("" when
	// available).
	Available bool   `json:"available"`
	Error     string `json:"error"`
}

// Features probes each kernel feature the agent uses (Probe stops at the
// first one missing; this reports them all). It needs root, as the
// kernel answers an unprivileged probe for most program types with EPERM:
// without it each program and map type is reported unavailable with that
// error. tp_btf is reported by the presence of kernel BTF (see Probe).
func Features() []Feature {
	fs := []Feature{
		// Kernel BTF: the tp_btf witness programs (tcp_retransmit_skb,
		// inet_sock_set_state) are typed by it. 5.5 added tp_btf; BTF in
		// /sys/kernel/btf needs CONFIG_DEBUG_INFO_BTF (most distributions
		// since 2020).
		{Name: "kernel BTF (/sys/kernel/btf/vmlinux)", Use: "tp_btf witness programs", Since: "5.5"},
		// cgroup v2 at cgroup2.Root(): each pod's programs are attached to its
		// cgroup; v1 hierarchies have no BPF attachment.
		{Name: "cgroup v2 at " + cgroup2.Root(), Use: "per-pod attachment", Since: "4.5"},
		// connect4/connect6 hooks: 4.17. sendmsg/recvmsg hooks came later
		// (4.18, 5.2) and egret does not use them.
		{Name: "BPF_PROG_TYPE_CGROUP_SOCK_ADDR", Use: "connect4/connect6 redirection", Since: "4.17"},
		// sock_ops: 4.13, its state callbacks 4.16; egret's program uses
		// the header-option callbacks (5.10) and bpf_get_netns_cookie
		// (5.15), which the load itself checks.
		{Name: "BPF_PROG_TYPE_SOCK_OPS", Use: "original-destination tuples and the witness", Since: "5.10"},
		// getsockopt hooks: 5.3. Older kernels cannot answer
		// SO_ORIGINAL_DST for redirected connects.
		{Name: "BPF_PROG_TYPE_CGROUP_SOCKOPT", Use: "answering SO_ORIGINAL_DST", Since: "5.3"},
		// socket local storage: 5.2.
		{Name: "BPF_MAP_TYPE_SK_STORAGE", Use: "per-socket records", Since: "5.2"},
		// BPF ring buffer: 5.8, the newest requirement.
		{Name: "BPF_MAP_TYPE_RINGBUF", Use: "witness events", Since: "5.8"},
		{Name: "BPF_MAP_TYPE_LPM_TRIE", Use: "excluded CIDRs", Since: "4.11"},
		{Name: "BPF_MAP_TYPE_LRU_HASH", Use: "original-destination tuples", Since: "4.10"},
	}
	set := func(i int, err error) {
		fs[i].Available = err == nil
		if err != nil {
			fs[i].Error = err.Error()
		}
	}
	_, err := os.Stat("/sys/kernel/btf/vmlinux")
	set(0, err)
	var st unix.Statfs_t
	err = unix.Statfs(cgroup2.Root(), &st)
	if err == nil && st.Type != unix.CGROUP2_SUPER_MAGIC {
		err = errNotCgroup2
	}
	set(1, err)
	for i, t := range []ebpf.ProgramType{ebpf.CGroupSockAddr, ebpf.SockOps, ebpf.CGroupSockopt} {
		set(2+i, features.HaveProgramType(t))
	}
	for i, t := range []ebpf.MapType{ebpf.SkStorage, ebpf.RingBuf, ebpf.LPMTrie, ebpf.LRUHash} {
		set(5+i, features.HaveMapType(t))
	}
	return fs
}

// errNotCgroup2 is Features' error for a cgroup2.Root() that is not cgroup2.
var errNotCgroup2 = errors.New("not a cgroup2 file system")

// KernelRelease is the running kernel's release (uname -r).
func KernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}
