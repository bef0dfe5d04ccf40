package e2e

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/egret-proxy/egret/agent/pods"
)

// firstByte runs count rounds of connect + write + first byte read from
// the pod to dst and returns the mean time of one round.
func (p *pod) firstByte(b *testing.B, dst netip.AddrPort, count int) float64 {
	b.Helper()
	out, err := p.run(b, p.childCmd(b, "firstbyte", request{URL: "tcp://" + dst.String(), Count: count}))
	if err != nil {
		b.Fatal(err)
	}
	var res struct {
		Nanos  int64 `json:"nanos"`
		Errors int   `json:"errors"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		b.Fatalf("firstbyte output %q: %v", out, err)
	}
	if res.Errors != 0 {
		b.Fatalf("%d of %d rounds failed", res.Errors, count)
	}
	return float64(res.Nanos) / float64(count)
}

// BenchmarkPassthroughFirstByte: connect + first byte of the answer for a
// destination egret passes through (a line protocol on the host end of the
// pod's veth), through egret (learning off: every connection is
// redirected, sniffed and dialed again by egret) and after it was learned
// direct. The time of one round is reported as ns/round; the ratio is
// logged.
//
//	sudo go test -run '^$' -bench PassthroughFirstByte -benchtime 2000x ./test/e2e/
func BenchmarkPassthroughFirstByte(b *testing.B) {
	n := newNode(b, nodeOpts{})
	through := n.addPod(b, "nolearn", podOpts{spec: pods.Pod{Learn: pods.Learning{Off: true}}})
	direct := n.addPod(b, "learn", podOpts{})
	_, dst := echoServer(b, through.host4)

	// One sniffed connection teaches egret the destination for "learn".
	r := direct.child(b, "echo", request{URL: "tcp://" + dst.String(), Body: "learn"})
	if r.Err != "" || !strings.HasPrefix(r.Local, "127.0.0.1:") {
		b.Fatalf("first connection: %+v", r)
	}
	r = direct.child(b, "echo", request{URL: "tcp://" + dst.String(), Body: "direct?"})
	if r.Err != "" || !strings.HasPrefix(r.Local, direct.pod4.String()+":") {
		b.Fatalf("second connection not direct: %+v", r)
	}

	var before, after float64
	b.Run("through-egret", func(b *testing.B) {
		before = through.firstByte(b, dst, b.N)
		b.ReportMetric(before, "ns/round")
	})
	b.Run("learned-direct", func(b *testing.B) {
		after = direct.firstByte(b, dst, b.N)
		b.ReportMetric(after, "ns/round")
	})
	if before > 0 && after > 0 {
		b.Logf("connect + first byte: through egret %.1f µs, learned direct %.1f µs, direct/through %.2f",
			before/1e3, after/1e3, after/before)
	}
}
