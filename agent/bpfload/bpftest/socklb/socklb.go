// Package socklb is a test-only stand-in for a CNI's socket load balancer
// (Cilium's socket LB): a cgroup/connect4 program (socklb.c) that rewrites
// connects to one Service address to its backend, meant to be attached at
// an ancestor cgroup of egret's pods, and that records every destination it
// saw per cgroup. agent/bpfload's tests use it to show the order of
// multi-attached cgroup programs. The bpf2go output is committed, as
// egret's own (bpf/).
package socklb

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-16 -strip llvm-strip-16 -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu" -type lb_config -type seen_key Socklb socklb.c
