// Package bpf holds egret's eBPF programs (egret.c) and the Go code bpf2go
// generates for them. The generated egret_bpfel.go / egret_bpfel.o are
// committed so that building egret needs no C toolchain; run `go generate`
// (clang-16, llvm-strip-16, libbpf-dev and linux-libc-dev headers) after
// changing the C sources. Loading, attaching and pinning live in
// agent/bpfload.
package bpf

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-16 -strip llvm-strip-16 -target bpfel -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu" -type pod_config -type globals -type excl_key -type orig_dst -type tuple_key -type redirect_state -type witness_rec -type event -type direct_key -type direct_entry -type direct_sock -type direct_stats -type flow_key -type flow_stats -type flow_sock Egret egret.c -- -I.
