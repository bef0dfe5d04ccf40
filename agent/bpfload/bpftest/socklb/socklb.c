//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
/*
 * A stand-in for a CNI's socket load balancer (Cilium's "socket LB",
 * kube-proxy replacement): a cgroup/connect4 program attached at an
 * ancestor cgroup of the pods (Cilium: the cgroup root), which rewrites a
 * connect to a Service address to one of its backends before any packet
 * exists. It records what it saw, per cgroup of the connecting socket and
 * destination, so a test can tell which program ran first.
 *
 * Test-only: agent/bpfload's tests attach it beside egret's per-pod
 * programs.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define SOCK_STREAM 1

/* The one Service and its one backend, network byte order. */
struct lb_config {
	__u32 service_ip;
	__u32 backend_ip;
	__u16 service_port;
	__u16 backend_port;
	__u32 _pad;
};

/* What the program saw: a connect from a socket of cgroup cgroup_id to
 * ip:port (network byte order), as it found it. */
struct seen_key {
	__u64 cgroup_id;
	__u32 ip;
	__u16 port;
	__u16 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_config);
} socklb_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct seen_key);
	__type(value, __u64);
} socklb_seen SEC(".maps");

SEC("cgroup/connect4")
int socklb_connect4(struct bpf_sock_addr *ctx)
{
	__u32 zero = 0;
	struct lb_config *cfg = bpf_map_lookup_elem(&socklb_config, &zero);

	if (!cfg || ctx->type != SOCK_STREAM)
		return 1;
	struct seen_key k = {
		.cgroup_id = bpf_get_current_cgroup_id(),
		.ip = ctx->user_ip4,
		.port = (__u16)ctx->user_port,
	};
	__u64 one = 1, *n = bpf_map_lookup_elem(&socklb_seen, &k);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&socklb_seen, &k, &one, BPF_NOEXIST);
	if (ctx->user_ip4 == cfg->service_ip && (__u16)ctx->user_port == cfg->service_port) {
		ctx->user_ip4 = cfg->backend_ip;
		ctx->user_port = cfg->backend_port;
	}
	return 1;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
