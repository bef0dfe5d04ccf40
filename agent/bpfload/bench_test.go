package bpfload_test

import (
	"net"
	"sort"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
)

// BenchmarkConnect measures connect() from inside pods (cgroup + netns) to
// a TCP listener in three set-ups measured in one run, interleaved in
// rounds so that machine noise hits all three alike:
//
//   - direct: the pod is attached but egret has no listener, so connect4
//     runs and lets the connect through (the fail-open path);
//   - ebpf: connect4 redirects to the pod's egret listener;
//   - nft: no eBPF, an nftables nat REDIRECT rule in the pod's namespace
//     (what an iptables REDIRECT set-up does).
//
// Not run in CI:
//
//	go test -run '^$' -bench Connect -benchtime 20000x ./agent/bpfload/
//
// Each iteration is socket + connect + close (RST) in the pod. Reported:
// median ns per connect of each mode over the rounds and the ratios.
func BenchmarkConnect(b *testing.B) {
	e := setup(b)
	target := "10.77.0.1:8080"
	type mode struct {
		name string
		p    pod
		l    *net.TCPListener
		per  []float64
	}
	direct := &mode{name: "direct", p: e.pod(b, "pod-direct", bpfload.PodConfig{Listen4: listen4}, "10.77.0.1/32")}
	direct.l = listen(b, e.self, direct.p.ns, target)

	ebpf := &mode{name: "ebpf", p: e.pod(b, "pod-ebpf", bpfload.PodConfig{Listen4: listen4}, "10.77.0.1/32")}
	ebpf.l = listen(b, e.self, ebpf.p.ns, listen4.String())
	listen(b, e.self, ebpf.p.ns, target) // the original, never reached

	nftm := &mode{name: "nft", p: pod{cg: e.cg.Sub(b, "pod-nft"), ns: bpftest.NewNetns(b, "10.77.0.1/32")}}
	nftm.l = listen(b, e.self, nftm.p.ns, "127.0.0.1:15002")
	nft(b, nftm.p.ns, "table ip egret_bench {\n chain out {\n  type nat hook output priority -100;\n  ip daddr 10.77.0.1 tcp dport 8080 redirect to :15002\n }\n}\n")

	modes := []*mode{direct, ebpf, nftm}
	for _, m := range modes {
		l := m.l
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	}

	const rounds = 7
	per := max(b.N/rounds, 1)
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		for _, m := range modes {
			_, res := bpftest.Socket(b, m.p.cg, m.p.ns, bpftest.Op{Kind: "connectloop", Family: unix.AF_INET, Addr: target, Count: per})
			if res.Err != "" {
				b.Fatalf("%s: %s", m.name, res.Err)
			}
			m.per = append(m.per, float64(res.Nanos)/float64(per))
		}
	}
	b.StopTimer()
	med := map[string]float64{}
	for _, m := range modes {
		sort.Float64s(m.per)
		med[m.name] = m.per[len(m.per)/2]
		b.ReportMetric(med[m.name], m.name+"-ns/connect")
	}
	b.ReportMetric(med["ebpf"]/med["direct"], "ebpf/direct")
	b.ReportMetric(med["nft"]/med["direct"], "nft/direct")
	b.ReportMetric(med["ebpf"]/med["nft"], "ebpf/nft")
}
