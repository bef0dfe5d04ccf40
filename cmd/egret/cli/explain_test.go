package cli

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry"
	"github.com/egret-proxy/egret/retry/attempt"
	"github.com/egret-proxy/egret/witness"
)

// TestExplainSaysAckedCountsSYN: the kernel's bytes acked, which explain
// shows beside bytes sent, counts the SYN as a byte (265 sent, 266 acked
// on a real loopback connection), and explain says so where it shows them.
func TestExplainSaysAckedCountsSYN(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const sent = 265
	if _, err := c.Write(bytes.Repeat([]byte("x"), sent)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, sent)
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(s, buf); err != nil {
		t.Fatal(err)
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	deadline := time.Now().Add(10 * time.Second)
	for {
		raw.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
		if err != nil {
			t.Fatal(err)
		}
		if info.Bytes_acked > sent || time.Now().After(deadline) {
			break // the peer's ACK of the data has come (or never will)
		}
	}
	if info.Bytes_sent != sent || info.Bytes_acked != sent+1 {
		t.Fatalf("TCP_INFO: bytes_sent %d, bytes_acked %d; want %d and %d (the SYN counted)", info.Bytes_sent, info.Bytes_acked, sent, sent+1)
	}

	bs := info.Bytes_sent
	var out strings.Builder
	writeExplain(&out, agent.TraceView{RequestID: "8e13ac3b035fce95", Attempts: []agent.AttemptView{{
		N: 1, Status: 200, WitnessAfter: &agent.CountersView{Source: "tcp_info", BytesSent: &bs, BytesAcked: info.Bytes_acked},
	}}})
	if want := "-> 266 (+1 each for SYN and FIN)"; !strings.Contains(out.String(), want) {
		t.Errorf("explain shows:\n%s\nwant it to say %q", out.String(), want)
	}
}

// TestExplainShowsKernelEvidenceAndIdleBound: egret explain of a POST the
// witness proved not sent (the upstream's FIN acked none of it) shows the
// acked bytes before and after, the proof, the pooled connection's idle
// time and the upstream's idle bound with its source.
func TestExplainShowsKernelEvidenceAndIdleBound(t *testing.T) {
	c := func(sent, acked, recv uint64, state uint8) witness.Counters {
		return witness.Counters{BytesSent: sent, HasBytesSent: true, BytesAcked: acked, HasBytesAcked: true,
			BytesReceived: recv, HasBytesReceived: true, State: state, Source: "tcp_info"}
	}
	tr := retry.Trace{RequestID: "8e13ac3b035fce95", Method: "POST", URL: "http://api/pay", Upstream: "api:80",
		Attempts: []retry.Attempt{{
			N: 1, Stage: retry.StageHeaders, Failure: engine.ConnectionReset, Evidence: engine.NotSent,
			Upgraded: true, Proof: retry.ProofEndedBeforeAck,
			WitnessBefore: c(65, 66, 40, witness.StateEstablished), WitnessAfter: c(131, 66, 41, witness.StateClose),
			Reused: true, Idle: 600 * time.Millisecond,
			IdleBound: attempt.IdleBound{Limit: 750 * time.Millisecond, Seen: time.Second, Source: attempt.IdleBoundKeepAlive},
			Decision:  engine.Result{Decision: engine.Retry, Reason: engine.ReasonNotSent},
		}}}
	var b strings.Builder
	writeExplain(&b, agent.ViewTrace(tr))
	out := b.String()
	for _, want := range []string{
		"evidence not_sent (upgraded by the witness: the upstream's FIN acked no byte of the request, then it reset them)",
		"bytes sent 65 -> 131",
		"acked 66 -> 66",
		"connection: a pooled connection idle 600.0 ms; idle bound 750.0 ms for requests that are not idempotent (keep-alive timeout: 1000.0 ms)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
}
