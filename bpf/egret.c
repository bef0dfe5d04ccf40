//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
/*
 * egret's eBPF programs. One object so that every program shares the same
 * maps; see README.md in this directory for the design.
 *
 *   cgroup/connect4, cgroup/connect6  (pod cgroups)   redirect TCP connects
 *                                                     (not learned-direct ones)
 *   sockops                           (pod + egret)   tuple map, witness,
 *                                                     direct-connection counters
 *   cgroup/getsockopt                 (egret cgroup)  answer SO_ORIGINAL_DST
 *   tp_btf programs                   (global)        witness events
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_tracing.h>

#include "egret.h"

struct sk_buff;

/* Only sk_err is read (CO-RE relocated): why a connect ended. */
struct sock {
	int sk_err;
} __attribute__((preserve_access_index));

#define AF_INET 2
#define AF_INET6 10
#define SOCK_STREAM 1
#define IPPROTO_TCP 6
#define SOL_IP 0
#define SOL_IPV6 41
#define SO_ORIGINAL_DST 80 /* also IP6T_SO_ORIGINAL_DST */
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_CLOSE 7
#define ENETUNREACH 101
#define ETIMEDOUT 110
#define ECONNREFUSED 111
#define EHOSTUNREACH 113
#define MAX_CGROUP_LEVEL 32

/* Minimal kernel struct for CO-RE reads from tp_btf programs. Only the
 * fields named here are relocated against the running kernel's BTF. */
struct tcp_sock {
	__u32 data_segs_out;
	__u64 bytes_sent;
	__u32 snd_nxt;
	__u32 snd_una;
	__u64 bytes_acked;
	__u32 total_retrans;
} __attribute__((preserve_access_index));

struct egret_sockaddr_in {
	__u16 family;
	__u16 port; /* network order */
	__u32 addr;
	__u8 zero[8];
};

struct egret_sockaddr_in6 {
	__u16 family;
	__u16 port;
	__u32 flowinfo;
	__u32 addr[4];
	__u32 scope_id;
};

/* ---- maps (all pinned by name so a restarted agent adopts them) ---- */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct pod_config);
	/* 8 KiB values: allocate per pod, not 32 MiB up front. */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct globals);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_globals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__type(key, struct excl_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_excl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct redirect_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_redir_sk SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	/* Live redirected connections per node; an entry is only needed
	 * until the listener has read it, and goes when the client closes.
	 * Preallocated: about 9 MiB. */
	__uint(max_entries, 65536);
	__type(key, struct tuple_key);
	__type(value, struct orig_dst);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_tuples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct witness_rec);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_witness SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	/* Destinations learned direct, all pods together. LRU: a pod that
	 * learns more than this pushes out the least recently used entries
	 * (of any pod); such a destination is redirected again and learned
	 * again, nothing else. Preallocated: about 5 MiB. Load can change
	 * the size (Options.LearnedMax). */
	__uint(max_entries, 65536);
	__type(key, struct direct_key);
	__type(value, struct direct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_direct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct direct_sock);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_direct_sk SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct direct_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_direct_stats SEC(".maps");

/* Flow outcomes of the connects connect4/6 left direct (flow_stats), per pod
 * and path. Per-CPU: no shared cache line on the connect path. 4096 pods
 * times EGRET_PATH_MAX paths; allocated as pods use them. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096 * EGRET_PATH_MAX);
	__type(key, struct flow_key);
	__type(value, struct flow_stats);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct flow_sock);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_flow_sk SEC(".maps");

/* The running agent's liveness: one socket of the agent's own
 * (bpfload.Loader.SetAlive), never handed to anyone else. The kernel takes a
 * socket out of a sockmap when the socket closes, so the entry goes the
 * instant the agent exits or is killed, even while its pods' listeners
 * live on (held by `egret keeper` so that connects queued on them survive).
 * The connect hooks redirect only while it is there: with no agent, pods'
 * new connects go direct. Looking a socket up in a sockmap from a cgroup
 * program needs Linux 5.10, older than the 5.15 egret needs anyway; on a
 * kernel without it the verifier refuses the connect programs and Load
 * fails, attaching nothing (pods connect direct). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egret_alive SEC(".maps");

/* Not called: its prototype puts struct event into BTF for bpf2go -type,
 * without adding a global variable. */
__attribute__((noinline)) int egret_event_btf(struct event *ev)
{
	return ev != 0;
}

/* ---- helpers ---- */

static __always_inline __u32 egret_mark(void)
{
	__u32 zero = 0;
	struct globals *g = bpf_map_lookup_elem(&egret_globals, &zero);

	return g ? g->mark : 0;
}

static __always_inline int is_egret_sock(struct bpf_sock *sk)
{
	__u32 mark = egret_mark();

	return mark != 0 && sk->mark == mark;
}

/* The pod whose cgroup is the caller's cgroup or its nearest ancestor with
 * a config (a pod cgroup may have container cgroups below it). */
static __always_inline struct pod_config *find_pod(__u64 *id)
{
	__u64 cg = bpf_get_current_cgroup_id();
	struct pod_config *pc = bpf_map_lookup_elem(&egret_pods, &cg);

	if (pc) {
		*id = cg;
		return pc;
	}
	for (int lvl = MAX_CGROUP_LEVEL - 1; lvl >= 0; lvl--) {
		__u64 a = bpf_get_current_ancestor_cgroup_id(lvl);

		if (!a)
			continue;
		pc = bpf_map_lookup_elem(&egret_pods, &a);
		if (pc) {
			*id = a;
			return pc;
		}
	}
	return 0;
}

static __always_inline int port_excluded(struct pod_config *pc, __u16 port)
{
	__u32 idx = port >> 6;

	if (idx >= 1024)
		return 1;
	return (pc->excluded_ports[idx] >> (port & 63)) & 1;
}

static __always_inline int addr_excluded(__u64 cgid, const __u32 addr[4])
{
	struct excl_key k = {
		.prefixlen = 64 + 128,
	};

	__builtin_memcpy(k.cgroup, &cgid, sizeof(cgid));
	k.addr[0] = addr[0];
	k.addr[1] = addr[1];
	k.addr[2] = addr[2];
	k.addr[3] = addr[3];
	return bpf_map_lookup_elem(&egret_excl, &k) != 0;
}

static __always_inline void map4(__u32 out[4], __u32 ip4)
{
	out[0] = 0;
	out[1] = 0;
	out[2] = bpf_htonl(0xffff);
	out[3] = ip4;
}

static __always_inline int is_mapped4(const __u32 a[4])
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
}

static __always_inline int loopback4(__u32 ip4)
{
	/* 127.0.0.0/8 and 0.0.0.0 (which connects to the local host). */
	return (bpf_ntohl(ip4) >> 24) == 127 || ip4 == 0;
}

static __always_inline int loopback6(const __u32 a[4])
{
	return a[0] == 0 && a[1] == 0 && a[2] == 0 &&
	       (a[3] == 0 || a[3] == bpf_htonl(1));
}

/* agent_alive: an agent runs (its socket is in egret_alive). */
static __always_inline int agent_alive(void)
{
	__u32 zero = 0;
	struct bpf_sock *s = bpf_map_lookup_elem(&egret_alive, &zero);

	if (!s)
		return 0;
	bpf_sk_release(s);
	return 1;
}

/* Fail-open: redirect only while an agent runs (agent_alive) and the pod's
 * egret listener exists in the caller's network namespace. If egret dies
 * connects go direct until it runs and listens again; connects queued on a
 * listener a moment before stay queued while egret keeper holds it. */
static __always_inline int listener4_alive(struct bpf_sock_addr *ctx, struct pod_config *pc)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *l;

	t.ipv4.daddr = pc->listen_ip4;
	t.ipv4.dport = bpf_htons(pc->listen_port4);
	l = bpf_sk_lookup_tcp(ctx, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!l)
		return 0;
	bpf_sk_release(l);
	return 1;
}

static __always_inline int listener6_alive(struct bpf_sock_addr *ctx, struct pod_config *pc)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *l;

	t.ipv6.daddr[0] = pc->listen_ip6[0];
	t.ipv6.daddr[1] = pc->listen_ip6[1];
	t.ipv6.daddr[2] = pc->listen_ip6[2];
	t.ipv6.daddr[3] = pc->listen_ip6[3];
	t.ipv6.dport = bpf_htons(pc->listen_port6);
	l = bpf_sk_lookup_tcp(ctx, &t, sizeof(t.ipv6), BPF_F_CURRENT_NETNS, 0);
	if (!l)
		return 0;
	bpf_sk_release(l);
	return 1;
}

static __always_inline int remember(struct bpf_sock_addr *ctx, __u64 cgid,
				    const __u32 addr[4], __u16 port, __u16 family)
{
	struct redirect_state *st;

	if (!ctx->sk)
		return 0;
	st = bpf_sk_storage_get(&egret_redir_sk, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return 0;
	st->orig.addr[0] = addr[0];
	st->orig.addr[1] = addr[1];
	st->orig.addr[2] = addr[2];
	st->orig.addr[3] = addr[3];
	st->orig.port = port;
	st->orig.family = family;
	st->orig.cgroup_id = cgid;
	st->has_key = 0;
	return 1;
}

/* learned_direct: the pod's egret learned that dst is passed through
 * (egret cannot act on it), and the entry has not expired. The socket is
 * then marked for the direct-connection counters. An expired entry is
 * deleted here. */
static __always_inline int learned_direct(struct bpf_sock_addr *ctx, __u64 cgid,
					  const __u32 addr[4], __u16 port)
{
	struct direct_key k = {
		.cgroup_id = cgid,
		.port = port,
	};
	struct direct_entry *e;
	struct direct_sock *ds;

	k.addr[0] = addr[0];
	k.addr[1] = addr[1];
	k.addr[2] = addr[2];
	k.addr[3] = addr[3];
	e = bpf_map_lookup_elem(&egret_direct, &k);
	if (!e)
		return 0;
	if (bpf_ktime_get_boot_ns() >= e->expires_ns) {
		/* Expired: redirect, and let egret sniff it again. */
		bpf_map_delete_elem(&egret_direct, &k);
		return 0;
	}
	if (ctx->sk) {
		ds = bpf_sk_storage_get(&egret_direct_sk, ctx->sk, 0,
					BPF_SK_STORAGE_GET_F_CREATE);
		if (ds) {
			ds->cgroup_id = cgid;
			ds->established = 0;
		}
	}
	return 1;
}

static __always_inline struct direct_stats *direct_stats(__u64 cgid)
{
	struct direct_stats *st = bpf_map_lookup_elem(&egret_direct_stats, &cgid);
	struct direct_stats zero = {};

	if (st)
		return st;
	bpf_map_update_elem(&egret_direct_stats, &cgid, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&egret_direct_stats, &cgid);
}

/* flow_mark: connect4/6 leave this connect direct for path; the tp_btf
 * programs count what becomes of it in egret_flows. */
static __always_inline int flow_mark(struct bpf_sock_addr *ctx, __u64 cgid, __u32 path)
{
	struct flow_sock *fs;

	if (!ctx->sk)
		return 1;
	fs = bpf_sk_storage_get(&egret_flow_sk, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (fs) {
		fs->cgroup_id = cgid;
		fs->path = path;
		fs->flags = 0;
		fs->acked_base = 0;
	}
	return 1;
}

static __always_inline struct flow_stats *flow_stats(struct flow_sock *fs)
{
	struct flow_key k = {
		.cgroup_id = fs->cgroup_id,
		.path = fs->path,
	};
	struct flow_stats zero = {};
	struct flow_stats *st = bpf_map_lookup_elem(&egret_flows, &k);

	if (st)
		return st;
	bpf_map_update_elem(&egret_flows, &k, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&egret_flows, &k);
}

/* ---- redirection ---- */

/* redirectable: a TCP connect from a socket that is not egret's own (UDP and
 * egret's marked upstream sockets always go as they are). */
static __always_inline int redirectable(struct bpf_sock_addr *ctx)
{
	if (ctx->type != SOCK_STREAM || ctx->protocol != IPPROTO_TCP)
		return 0;
	return ctx->sk && !is_egret_sock(ctx->sk);
}

SEC("cgroup/connect4")
int egret_connect4(struct bpf_sock_addr *ctx)
{
	struct pod_config *pc;
	__u32 dst, a[4];
	__u16 port;
	__u64 cgid = 0;

	if (!redirectable(ctx))
		return 1;
	pc = find_pod(&cgid);
	if (!pc || !(pc->flags & EGRET_POD_HAS_V4))
		return 1;

	dst = ctx->user_ip4;
	port = bpf_ntohs((__u16)ctx->user_port);
	if (dst == pc->listen_ip4 && port == pc->listen_port4)
		return 1;
	if (loopback4(dst) && !(pc->flags & EGRET_POD_REDIRECT_LOOPBACK))
		return 1;
	if (port_excluded(pc, port))
		return flow_mark(ctx, cgid, EGRET_PATH_POLICY_PORT);
	map4(a, dst);
	if (addr_excluded(cgid, a))
		return flow_mark(ctx, cgid, EGRET_PATH_POLICY_CIDR);
	if (!(pc->flags & EGRET_POD_NO_LEARN) && learned_direct(ctx, cgid, a, port))
		return flow_mark(ctx, cgid, EGRET_PATH_LEARNED);
	if (!agent_alive() || !listener4_alive(ctx, pc))
		return flow_mark(ctx, cgid, EGRET_PATH_FAIL_OPEN);
	if (!remember(ctx, cgid, a, port, AF_INET))
		return 1; /* no place to keep the original: leave it alone */

	ctx->user_ip4 = pc->listen_ip4;
	ctx->user_port = bpf_htons(pc->listen_port4);
	return 1;
}

SEC("cgroup/connect6")
int egret_connect6(struct bpf_sock_addr *ctx)
{
	struct pod_config *pc;
	__u32 a[4];
	__u16 port;
	__u64 cgid = 0;

	if (!redirectable(ctx))
		return 1;
	pc = find_pod(&cgid);
	if (!pc)
		return 1;

	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	port = bpf_ntohs((__u16)ctx->user_port);

	if (is_mapped4(a)) {
		/* A dual-stack socket dialing an IPv4 address. */
		if (!(pc->flags & EGRET_POD_HAS_V4))
			return 1;
		if (a[3] == pc->listen_ip4 && port == pc->listen_port4)
			return 1;
		if (loopback4(a[3]) && !(pc->flags & EGRET_POD_REDIRECT_LOOPBACK))
			return 1;
		if (port_excluded(pc, port))
			return flow_mark(ctx, cgid, EGRET_PATH_POLICY_PORT);
		if (addr_excluded(cgid, a))
			return flow_mark(ctx, cgid, EGRET_PATH_POLICY_CIDR);
		if (!(pc->flags & EGRET_POD_NO_LEARN) && learned_direct(ctx, cgid, a, port))
			return flow_mark(ctx, cgid, EGRET_PATH_LEARNED);
		if (!agent_alive() || !listener4_alive(ctx, pc))
			return flow_mark(ctx, cgid, EGRET_PATH_FAIL_OPEN);
		if (!remember(ctx, cgid, a, port, AF_INET))
			return 1;
		ctx->user_ip6[3] = pc->listen_ip4;
		ctx->user_port = bpf_htons(pc->listen_port4);
		return 1;
	}

	if (!(pc->flags & EGRET_POD_HAS_V6))
		return 1;
	if (a[0] == pc->listen_ip6[0] && a[1] == pc->listen_ip6[1] &&
	    a[2] == pc->listen_ip6[2] && a[3] == pc->listen_ip6[3] &&
	    port == pc->listen_port6)
		return 1;
	if (loopback6(a) && !(pc->flags & EGRET_POD_REDIRECT_LOOPBACK))
		return 1;
	if (port_excluded(pc, port))
		return flow_mark(ctx, cgid, EGRET_PATH_POLICY_PORT);
	if (addr_excluded(cgid, a))
		return flow_mark(ctx, cgid, EGRET_PATH_POLICY_CIDR);
	if (!(pc->flags & EGRET_POD_NO_LEARN) && learned_direct(ctx, cgid, a, port))
		return flow_mark(ctx, cgid, EGRET_PATH_LEARNED);
	if (!agent_alive() || !listener6_alive(ctx, pc))
		return flow_mark(ctx, cgid, EGRET_PATH_FAIL_OPEN);
	if (!remember(ctx, cgid, a, port, AF_INET6))
		return 1;
	ctx->user_ip6[0] = pc->listen_ip6[0];
	ctx->user_ip6[1] = pc->listen_ip6[1];
	ctx->user_ip6[2] = pc->listen_ip6[2];
	ctx->user_ip6[3] = pc->listen_ip6[3];
	ctx->user_port = bpf_htons(pc->listen_port6);
	return 1;
}

/* ---- original destination: SO_ORIGINAL_DST on the accepted socket ---- */

SEC("cgroup/getsockopt")
int egret_getsockopt(struct bpf_sockopt *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	struct tuple_key k = {};
	struct orig_dst *o;

	if (ctx->optname != SO_ORIGINAL_DST)
		return 1;
	if (ctx->level != SOL_IP && ctx->level != SOL_IPV6)
		return 1;
	if (!sk || sk->protocol != IPPROTO_TCP)
		return 1;

	k.netns = bpf_get_netns_cookie(ctx);
	if (sk->family == AF_INET) {
		map4(k.server, sk->src_ip4);
		map4(k.client, sk->dst_ip4);
	} else if (sk->family == AF_INET6) {
		k.server[0] = sk->src_ip6[0];
		k.server[1] = sk->src_ip6[1];
		k.server[2] = sk->src_ip6[2];
		k.server[3] = sk->src_ip6[3];
		k.client[0] = sk->dst_ip6[0];
		k.client[1] = sk->dst_ip6[1];
		k.client[2] = sk->dst_ip6[2];
		k.client[3] = sk->dst_ip6[3];
	} else {
		return 1;
	}
	k.server_port = sk->src_port;
	k.client_port = bpf_ntohs(sk->dst_port);

	o = bpf_map_lookup_elem(&egret_tuples, &k);
	if (!o)
		return 1; /* not ours: keep the kernel's answer */

	if (ctx->level == SOL_IP) {
		struct egret_sockaddr_in *sin = ctx->optval;

		if (!is_mapped4(o->addr))
			return 1;
		if ((void *)(sin + 1) > ctx->optval_end)
			return 1;
		sin->family = AF_INET;
		sin->port = bpf_htons(o->port);
		sin->addr = o->addr[3];
		__builtin_memset(sin->zero, 0, sizeof(sin->zero));
		ctx->optlen = sizeof(*sin);
	} else {
		struct egret_sockaddr_in6 *sin6 = ctx->optval;

		if ((void *)(sin6 + 1) > ctx->optval_end)
			return 1;
		sin6->family = AF_INET6;
		sin6->port = bpf_htons(o->port);
		sin6->flowinfo = 0;
		sin6->addr[0] = o->addr[0];
		sin6->addr[1] = o->addr[1];
		sin6->addr[2] = o->addr[2];
		sin6->addr[3] = o->addr[3];
		sin6->scope_id = 0;
		ctx->optlen = sizeof(*sin6);
	}
	ctx->retval = 0;
	return 1;
}

/* ---- sockops: tuple map for redirected clients, witness for egret ---- */

static __always_inline void emit(struct witness_rec *r, __u32 type, __u16 old, __u16 new)
{
	struct event ev = {
		.ts_ns = bpf_ktime_get_boot_ns(),
		.cookie = r->cookie,
		.tx_bytes = r->tx_bytes,
		.bytes_acked = r->k_bytes_acked,
		.type = type,
		.data_segs_out = r->k_data_segs_out,
		.total_retrans = r->k_total_retrans,
		.old_state = old,
		.new_state = new,
	};

	bpf_ringbuf_output(&egret_events, &ev, sizeof(ev), 0);
}

static __always_inline void ops_refresh(struct witness_rec *r, struct bpf_sock_ops *ctx)
{
	r->k_bytes_acked = ctx->bytes_acked;
	r->k_data_segs_out = ctx->data_segs_out;
	r->k_total_retrans = ctx->total_retrans;
	r->snd_una = ctx->snd_una;
	r->snd_nxt = ctx->snd_nxt;
}

static __always_inline void fill_client_key(struct tuple_key *k, struct bpf_sock_ops *ctx)
{
	k->netns = bpf_get_netns_cookie(ctx);
	if (ctx->family == AF_INET) {
		map4(k->client, ctx->local_ip4);
		map4(k->server, ctx->remote_ip4);
	} else {
		k->client[0] = ctx->local_ip6[0];
		k->client[1] = ctx->local_ip6[1];
		k->client[2] = ctx->local_ip6[2];
		k->client[3] = ctx->local_ip6[3];
		k->server[0] = ctx->remote_ip6[0];
		k->server[1] = ctx->remote_ip6[1];
		k->server[2] = ctx->remote_ip6[2];
		k->server[3] = ctx->remote_ip6[3];
	}
	k->client_port = ctx->local_port;
	k->server_port = bpf_ntohl(ctx->remote_port);
}

static __always_inline void on_connect(struct bpf_sock_ops *ctx, struct bpf_sock *sk)
{
	struct redirect_state *st;
	struct witness_rec *r;
	struct direct_sock *ds;
	struct direct_stats *dst;

	ds = bpf_sk_storage_get(&egret_direct_sk, sk, 0, 0);
	if (ds) {
		/* Sent direct by a learned entry: count what becomes of it. */
		dst = direct_stats(ds->cgroup_id);
		if (dst)
			__sync_fetch_and_add(&dst->connects, 1);
		bpf_sock_ops_cb_flags_set(ctx, BPF_SOCK_OPS_STATE_CB_FLAG);
		return;
	}
	st = bpf_sk_storage_get(&egret_redir_sk, sk, 0, 0);
	if (st) {
		/* A redirected pod socket: its source port is known now, before
		 * the SYN, so the listener can find the original on accept. */
		fill_client_key(&st->key, ctx);
		st->has_key = 1;
		bpf_map_update_elem(&egret_tuples, &st->key, &st->orig, BPF_ANY);
		bpf_sock_ops_cb_flags_set(ctx, BPF_SOCK_OPS_STATE_CB_FLAG);
		return;
	}
	if (!is_egret_sock(sk))
		return;
	r = bpf_sk_storage_get(&egret_witness, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!r)
		return;
	r->cookie = bpf_get_socket_cookie(ctx);
	r->enrolled_ns = bpf_ktime_get_boot_ns();
	r->flags |= EGRET_WITNESS_COMPLETE;
	r->state = ctx->state;
	ops_refresh(r, ctx);
	bpf_sock_ops_cb_flags_set(ctx, BPF_SOCK_OPS_STATE_CB_FLAG | BPF_SOCK_OPS_RTO_CB_FLAG |
					       BPF_SOCK_OPS_RETRANS_CB_FLAG |
					       BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
}

SEC("sockops")
int egret_sockops(struct bpf_sock_ops *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	struct witness_rec *r;
	struct redirect_state *st;
	struct direct_sock *ds;
	struct direct_stats *dst;

	if (!sk)
		return 1;

	switch (ctx->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		on_connect(ctx, sk);
		break;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		/* Runs for every segment this socket transmits, just before it
		 * is handed to IP; skb_len is its payload. */
		r = bpf_sk_storage_get(&egret_witness, sk, 0, 0);
		if (!r)
			break;
		if (ctx->skb_len > 0) {
			r->tx_bytes += ctx->skb_len;
			r->tx_data_skbs++;
		}
		ops_refresh(r, ctx);
		break;
	case BPF_SOCK_OPS_RTO_CB:
		r = bpf_sk_storage_get(&egret_witness, sk, 0, 0);
		if (!r)
			break;
		r->rtos++;
		ops_refresh(r, ctx);
		emit(r, EGRET_EV_RTO, r->state, r->state);
		break;
	case BPF_SOCK_OPS_RETRANS_CB:
		r = bpf_sk_storage_get(&egret_witness, sk, 0, 0);
		if (!r)
			break;
		if (ctx->args[2] == 0)
			r->retrans_segs += ctx->args[1];
		ops_refresh(r, ctx);
		break;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		r = bpf_sk_storage_get(&egret_witness, sk, 0, 0);
		if (r) {
			ops_refresh(r, ctx);
			break;
		}
		ds = bpf_sk_storage_get(&egret_direct_sk, sk, 0, 0);
		if (ds && !ds->established) {
			ds->established = 1;
			dst = direct_stats(ds->cgroup_id);
			if (dst)
				__sync_fetch_and_add(&dst->established, 1);
		}
		break;
	case BPF_SOCK_OPS_STATE_CB:
		if (ctx->args[1] != TCP_CLOSE)
			break;
		ds = bpf_sk_storage_get(&egret_direct_sk, sk, 0, 0);
		if (ds) {
			dst = direct_stats(ds->cgroup_id);
			if (!dst)
				break;
			if (!ds->established) {
				__sync_fetch_and_add(&dst->failed, 1);
				break;
			}
			__sync_fetch_and_add(&dst->closed, 1);
			__sync_fetch_and_add(&dst->bytes_acked, ctx->bytes_acked);
			__sync_fetch_and_add(&dst->bytes_received, ctx->bytes_received);
			break;
		}
		st = bpf_sk_storage_get(&egret_redir_sk, sk, 0, 0);
		if (st && st->has_key) {
			bpf_map_delete_elem(&egret_tuples, &st->key);
			st->has_key = 0;
		}
		break;
	}
	return 1;
}

/* ---- tp_btf: witness events (global; only tracked sockets count) ---- */

static __always_inline void tp_refresh(struct witness_rec *r, struct sock *sk)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);

	if (!tp)
		return;
	r->k_bytes_sent = tp->bytes_sent;
	r->k_bytes_acked = tp->bytes_acked;
	r->k_data_segs_out = tp->data_segs_out;
	r->k_total_retrans = tp->total_retrans;
	r->snd_una = tp->snd_una;
	r->snd_nxt = tp->snd_nxt;
}

/* flow_state: a direct pod socket changed state. Connects are counted as the
 * SYN goes (CLOSE -> SYN_SENT); a connect that ends in SYN_SENT is classed
 * by the error the kernel gives the pod (set before the state changes). */
static __always_inline void flow_state(struct flow_sock *fs, struct sock *sk, int oldstate,
				       int newstate)
{
	struct flow_stats *st = flow_stats(fs);
	struct tcp_sock *tp;
	int err;

	if (!st)
		return;
	if (newstate == TCP_SYN_SENT) {
		fs->flags = 0;
		__sync_fetch_and_add(&st->connects, 1);
		return;
	}
	if (oldstate == TCP_SYN_SENT && newstate == TCP_ESTABLISHED) {
		fs->flags |= EGRET_FLOW_ESTABLISHED;
		tp = bpf_skc_to_tcp_sock(sk);
		fs->acked_base = tp ? tp->bytes_acked : 0;
		__sync_fetch_and_add(&st->established, 1);
		return;
	}
	if (newstate != TCP_CLOSE)
		return;
	if (fs->flags & EGRET_FLOW_ESTABLISHED) {
		tp = bpf_skc_to_tcp_sock(sk);
		if (tp)
			__sync_fetch_and_add(&st->segs_out, tp->data_segs_out);
		return;
	}
	if (oldstate != TCP_SYN_SENT || (fs->flags & EGRET_FLOW_ENDED))
		return;
	fs->flags |= EGRET_FLOW_ENDED;
	err = sk->sk_err;
	if (err == ECONNREFUSED)
		__sync_fetch_and_add(&st->refused, 1);
	else if (err == ETIMEDOUT)
		__sync_fetch_and_add(&st->timed_out, 1);
	else if (err == EHOSTUNREACH || err == ENETUNREACH)
		__sync_fetch_and_add(&st->unreachable, 1);
	else
		__sync_fetch_and_add(&st->abandoned, 1);
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(egret_set_state, struct sock *sk, int oldstate, int newstate)
{
	struct witness_rec *r = bpf_sk_storage_get(&egret_witness, sk, 0, 0);
	struct flow_sock *fs;

	if (!r) {
		fs = bpf_sk_storage_get(&egret_flow_sk, sk, 0, 0);
		if (fs)
			flow_state(fs, sk, oldstate, newstate);
		return 0;
	}
	r->state = newstate;
	tp_refresh(r, sk);
	emit(r, EGRET_EV_STATE, oldstate, newstate);
	return 0;
}

SEC("tp_btf/tcp_receive_reset")
int BPF_PROG(egret_rx_reset, struct sock *sk)
{
	struct witness_rec *r = bpf_sk_storage_get(&egret_witness, sk, 0, 0);
	struct direct_sock *ds;
	struct direct_stats *dst;
	struct flow_sock *fs;
	struct flow_stats *st;
	struct tcp_sock *tp;

	if (!r) {
		fs = bpf_sk_storage_get(&egret_flow_sk, sk, 0, 0);
		/* A reset in SYN_SENT is a refusal, counted at close. */
		if (fs && (fs->flags & EGRET_FLOW_ESTABLISHED) && !(fs->flags & EGRET_FLOW_ENDED)) {
			fs->flags |= EGRET_FLOW_ENDED;
			st = flow_stats(fs);
			tp = bpf_skc_to_tcp_sock(sk);
			if (st && tp) {
				if (tp->bytes_acked > fs->acked_base)
					__sync_fetch_and_add(&st->reset_after_ack, 1);
				else
					__sync_fetch_and_add(&st->reset_before_ack, 1);
			}
		}
		ds = bpf_sk_storage_get(&egret_direct_sk, sk, 0, 0);
		if (!ds)
			return 0;
		dst = bpf_map_lookup_elem(&egret_direct_stats, &ds->cgroup_id);
		if (dst)
			__sync_fetch_and_add(&dst->resets, 1);
		return 0;
	}
	if (!r->reset_ns)
		r->reset_ns = bpf_ktime_get_boot_ns();
	r->resets++;
	tp_refresh(r, sk);
	emit(r, EGRET_EV_RESET, r->state, r->state);
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(egret_retransmit, struct sock *sk, struct sk_buff *skb)
{
	struct witness_rec *r = bpf_sk_storage_get(&egret_witness, sk, 0, 0);
	struct flow_sock *fs;
	struct flow_stats *st;

	if (!r) {
		fs = bpf_sk_storage_get(&egret_flow_sk, sk, 0, 0);
		if (fs) {
			st = flow_stats(fs);
			if (st)
				__sync_fetch_and_add(&st->retransmits, 1);
		}
		return 0;
	}
	tp_refresh(r, sk);
	emit(r, EGRET_EV_RETRANSMIT, r->state, r->state);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(egret_send_length, struct sock *sk, int ret, int flags)
{
	struct witness_rec *r;

	if (ret <= 0)
		return 0;
	r = bpf_sk_storage_get(&egret_witness, sk, 0, 0);
	if (!r)
		return 0;
	r->app_bytes += ret;
	tp_refresh(r, sk);
	return 0;
}

char _license[] SEC("license") = "Dual MIT/GPL";
