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

// BenchmarkManyShortConnects asks whether counting a pod's direct flows
// costs that pod or another pod anything measurable. A storm pod opens
// 100,000 short connections (socket, connect, close with RST) in rounds
// of 10,000, once with its connects counted (attached, the destination
// port direct by policy: a flow_sock and per-CPU counters per connect)
// and once not (a cgroup egret is not attached to: no connect4, and the
// node-wide tp_btf programs find no flow_sock and return), the two
// interleaved round by round. During each round a victim pod, redirected
// to its egret listener, times 2,000 connects of its own. Not run in CI:
//
//	go test -run '^$' -bench ManyShortConnects -benchtime 1x ./agent/bpfload/
//
// Reported: the median ns per connect of each storm and of the victim
// during each, the counted storm's first and last rounds (the 100,000th
// connect costs what the first did: one entry per pod and path, whatever
// the count), and egret_flows' entries and memory afterwards.
func BenchmarkManyShortConnects(b *testing.B) {
	e := setup(b)
	target := "10.77.0.1:8080"
	counted := e.pod(b, "storm-counted", bpfload.PodConfig{Listen4: listen4, ExcludePorts: []uint16{8080}}, "10.77.0.1/32")
	plain := pod{cg: e.cg.Sub(b, "storm-plain"), ns: bpftest.NewNetns(b, "10.77.0.1/32")}
	victim := e.pod(b, "victim", bpfload.PodConfig{Listen4: listen4}, "10.77.0.1/32")
	ls := []*net.TCPListener{
		listen(b, e.self, counted.ns, target), listen(b, e.self, plain.ns, target),
		listen(b, e.self, victim.ns, listen4.String()), listen(b, e.self, victim.ns, target),
	}
	for _, l := range ls {
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
	before, err := e.l.FlowEntries()
	if err != nil {
		b.Fatal(err)
	}
	const rounds, stormPer, victimPer = 10, 10_000, 2_000
	type storm struct {
		name        string
		p           pod
		per, victim []float64
	}
	storms := []*storm{{name: "counted", p: counted}, {name: "plain", p: plain}}
	b.ResetTimer()
	for range rounds {
		for _, s := range storms {
			done := make(chan bpftest.Result, 1)
			errc := make(chan error, 1)
			go func() {
				res, err := bpftest.Loop(s.p.cg, s.p.ns, bpftest.Op{Kind: "connectloop", Family: unix.AF_INET, Addr: target, Count: stormPer})
				errc <- err
				done <- res
			}()
			_, vres := bpftest.Socket(b, victim.cg, victim.ns, bpftest.Op{Kind: "connectloop", Family: unix.AF_INET, Addr: target, Count: victimPer})
			if err := <-errc; err != nil {
				b.Fatalf("%s storm: %v", s.name, err)
			}
			res := <-done
			if res.Err != "" || vres.Err != "" {
				b.Fatalf("%s storm: %q, victim: %q", s.name, res.Err, vres.Err)
			}
			s.per = append(s.per, float64(res.Nanos)/stormPer)
			s.victim = append(s.victim, float64(vres.Nanos)/victimPer)
		}
	}
	b.StopTimer()
	first, last := storms[0].per[0], storms[0].per[rounds-1]
	median := func(v []float64) float64 {
		w := append([]float64(nil), v...)
		sort.Float64s(w)
		return w[len(w)/2]
	}
	for _, s := range storms {
		b.ReportMetric(median(s.per), s.name+"-storm-ns/connect")
		b.ReportMetric(median(s.victim), "victim-during-"+s.name+"-ns/connect")
	}
	b.ReportMetric(median(storms[0].per)/median(storms[1].per), "storm-counted/plain")
	b.ReportMetric(median(storms[0].victim)/median(storms[1].victim), "victim-counted/plain")
	b.ReportMetric(last/first, "counted-last/first-round")
	flows, err := e.l.PodFlows(counted.id)
	if err != nil {
		b.Fatal(err)
	}
	if got := flows[bpfload.PathPolicyPort].Connects; got != rounds*stormPer {
		b.Errorf("counted %d connects, want %d", got, rounds*stormPer)
	}
	after, err := e.l.FlowEntries()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(after-before), "flow-entries-added")
	b.ReportMetric(float64(e.l.FlowsMemlock()), "egret_flows-bytes")
}
