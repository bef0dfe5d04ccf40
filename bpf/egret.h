/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * Types shared between egret's eBPF programs (egret.c) and user space.
 * bpf2go turns every struct named with -type into a Go type in package bpf,
 * so field order and padding here are the wire format of the maps.
 */
#ifndef EGRET_BPF_H
#define EGRET_BPF_H

#include <linux/types.h>

/* pod_config.flags */
#define EGRET_POD_HAS_V4 (1U << 0)           /* listen_ip4/listen_port4 valid */
#define EGRET_POD_HAS_V6 (1U << 1)           /* listen_ip6/listen_port6 valid */
#define EGRET_POD_REDIRECT_LOOPBACK (1U << 2) /* also redirect 127/8 and ::1 */
#define EGRET_POD_NO_LEARN (1U << 3)          /* ignore egret_direct for this pod */

/* Per-pod configuration, keyed by the cgroup v2 id of the pod's cgroup. */
struct pod_config {
	__u32 flags;
	__u16 listen_port4; /* host byte order */
	__u16 listen_port6; /* host byte order */
	__u32 listen_ip4;   /* network byte order */
	__u32 listen_ip6[4];
	/* Bitmap of destination ports that always go direct (bit p = port p). */
	__u64 excluded_ports[1024];
};

/* Node-wide settings, one entry in the array map egret_globals. */
struct globals {
	/* SO_MARK egret puts on its own upstream sockets: such sockets are
	 * never redirected and are the only ones the witness tracks. 0 = off. */
	__u32 mark;
	__u32 flags;
};

/* Key of the per-pod excluded-CIDR LPM trie. data = cgroup id (8 bytes,
 * host order) followed by the address as 16 bytes (IPv4 as ::ffff:a.b.c.d).
 * prefixlen counts from the start of data: 64 + 96 + v4len or 64 + v6len. */
struct excl_key {
	__u32 prefixlen;
	__u32 cgroup[2];
	__u32 addr[4];
};

/* An original destination. addr is always 16 bytes, IPv4 as ::ffff:a.b.c.d. */
struct orig_dst {
	__u32 addr[4];
	__u16 port;   /* host byte order */
	__u16 family; /* AF_INET or AF_INET6, as the client asked */
	__u32 pad;
	__u64 cgroup_id; /* pod cgroup whose config redirected it */
};

/* A redirected connection as its two ends see it, inside one network
 * namespace. Addresses are 16 bytes (IPv4 mapped), ports host order. */
struct tuple_key {
	__u64 netns; /* network namespace cookie */
	__u32 client[4];
	__u32 server[4]; /* the egret listener */
	__u16 client_port;
	__u16 server_port;
	__u32 pad;
};

/* Per-socket storage on a redirected client socket. */
struct redirect_state {
	struct orig_dst orig;
	struct tuple_key key;
	__u32 has_key;
	__u32 pad;
};

/* Key of egret_direct: one destination learned direct for one pod. */
struct direct_key {
	__u64 cgroup_id; /* the pod's cgroup (the one with a pod_config) */
	__u32 addr[4];   /* IPv4 as ::ffff:a.b.c.d */
	__u16 port;      /* host byte order */
	__u16 pad;
	__u32 pad2;
};

/* A learned-direct destination. User space writes it after egret's proxy
 * sniffed a connection to it as a protocol egret passes through. */
struct direct_entry {
	__u64 expires_ns; /* CLOCK_BOOTTIME; from then on connects are redirected again */
	__u64 learned_ns; /* CLOCK_BOOTTIME when learned */
	__u32 protocol;   /* DIRECT_PROTO_*: what the proxy sniffed */
	__u32 pad;
};

/* direct_entry.protocol */
#define EGRET_DIRECT_PROTO_OTHER 0
#define EGRET_DIRECT_PROTO_TLS 1
#define EGRET_DIRECT_PROTO_HTTP2 2
#define EGRET_DIRECT_PROTO_SERVER_FIRST 3

/* Per-socket storage on a pod socket that connect4/6 sent direct because
 * of a learned entry: the sockops and tp_btf programs count it. */
struct direct_sock {
	__u64 cgroup_id;
	__u32 established;
	__u32 pad;
};

/* What the kernel saw of one pod's learned-direct connections (counters
 * only grow; egret_direct_stats, keyed by the pod's cgroup id). */
struct direct_stats {
	__u64 connects;       /* connects sent direct by a learned entry */
	__u64 established;    /* of those, the ones that completed the handshake */
	__u64 failed;         /* closed before established: refused, unreachable, timed out */
	__u64 resets;         /* RSTs received (a refusal included) */
	__u64 closed;         /* established connections that closed */
	__u64 bytes_acked;    /* sent and acknowledged, summed at close */
	__u64 bytes_received; /* received, summed at close */
};

/* Flow outcomes of the pod connections egret does not proxy.
 * flow_key.path: why connect4/6 left the connect alone. */
#define EGRET_PATH_POLICY_PORT 1 /* port in the pod's excluded-port bitmap */
#define EGRET_PATH_POLICY_CIDR 2 /* address in one of the pod's excluded CIDRs */
#define EGRET_PATH_LEARNED 3     /* learned direct (egret_direct) */
#define EGRET_PATH_FAIL_OPEN 4   /* no agent or no listener: failed open */
#define EGRET_PATH_MAX 4

/* Key of egret_flows (per-CPU hash): one pod and one path. */
struct flow_key {
	__u64 cgroup_id; /* the pod's cgroup (the one with a pod_config) */
	__u32 path;      /* EGRET_PATH_* */
	__u32 pad;
};

/* What the kernel saw of one pod's direct connections on one path, per CPU
 * (user space sums the CPUs). Counters only grow. Each connection ends in
 * at most one of refused / timed_out / unreachable / abandoned /
 * reset_before_ack / reset_after_ack. */
struct flow_stats {
	__u64 connects;         /* SYN sent (CLOSE -> SYN_SENT) */
	__u64 established;      /* handshake completed */
	__u64 refused;          /* closed in SYN_SENT with ECONNREFUSED (RST or ICMP port unreachable) */
	__u64 timed_out;        /* closed in SYN_SENT with ETIMEDOUT: SYN retries exhausted */
	__u64 unreachable;      /* closed in SYN_SENT with EHOSTUNREACH / ENETUNREACH */
	__u64 abandoned;        /* closed in SYN_SENT otherwise (the pod gave up first) */
	__u64 reset_before_ack; /* RST after the handshake, none of our bytes acked */
	__u64 reset_after_ack;  /* RST after some of our bytes were acked */
	__u64 retransmits;      /* retransmitted segments, SYNs included */
	__u64 segs_out;         /* data segments sent, summed at close */
};

/* flow_sock.flags */
#define EGRET_FLOW_ESTABLISHED (1U << 0)
#define EGRET_FLOW_ENDED (1U << 1) /* its outcome is counted */

/* Per-socket storage on a pod socket connect4/6 left direct. */
struct flow_sock {
	__u64 cgroup_id;
	__u32 path;
	__u32 flags;
	/* tcp_sock.bytes_acked when the handshake completed (the SYN counts
	 * as one byte there): more at a reset means some of ours were acked. */
	__u64 acked_base;
};

/* witness_rec.flags */
#define EGRET_WITNESS_COMPLETE (1U << 0) /* tracked from before the SYN */

/* What the witness knows about one of egret's upstream sockets. */
struct witness_rec {
	__u64 cookie;       /* socket cookie (SO_COOKIE) */
	__u64 enrolled_ns;  /* CLOCK_BOOTTIME when tracking started */
	/* Payload bytes / data-carrying skbs handed to IP, counted at the
	 * per-segment header-option hook, retransmissions included. */
	__u64 tx_bytes;
	__u64 tx_data_skbs;
	__u64 app_bytes;    /* bytes accepted by sendmsg (sock_send_length) */
	/* Kernel tcp_sock counters as of the latest hook. */
	__u64 k_bytes_sent;
	__u64 k_bytes_acked;
	__u32 k_data_segs_out;
	__u32 k_total_retrans;
	__u32 snd_una;
	__u32 snd_nxt;
	__u32 retrans_segs; /* from BPF_SOCK_OPS_RETRANS_CB */
	__u32 rtos;         /* BPF_SOCK_OPS_RTO_CB firings */
	__u64 reset_ns;     /* CLOCK_BOOTTIME of the first RST received, 0 = none */
	__u32 resets;
	__u32 flags;
	__u8 state;         /* TCP state, linux numbering */
	__u8 pad[7];
};

/* event.type */
#define EGRET_EV_STATE 1
#define EGRET_EV_RESET 2
#define EGRET_EV_RETRANSMIT 3
#define EGRET_EV_RTO 4

/* One ring buffer record. */
struct event {
	__u64 ts_ns; /* CLOCK_BOOTTIME */
	__u64 cookie;
	__u64 tx_bytes;
	__u64 bytes_acked;
	__u32 type;
	__u32 data_segs_out;
	__u32 total_retrans;
	__u16 old_state;
	__u16 new_state;
};

#endif
