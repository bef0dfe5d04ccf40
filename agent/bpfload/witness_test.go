package bpfload_test

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/witness"
)

const upstream = "10.77.0.1:9100"

// upstreamPair dials upstream from egret's cgroup, marked like egret's own
// upstream sockets, and returns both ends.
func upstreamPair(t testing.TB, e *env, srv *net.TCPListener, mark uint32) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	c, _ := dial(t, e.self, e.upNS, bpftest.Op{Addr: upstream, Mark: mark})
	s := accept(t, srv, 3*time.Second)
	if s == nil {
		t.Fatal("upstream saw no connection")
	}
	return c.(*net.TCPConn), s
}

func (e *env) upstream(t testing.TB) *net.TCPListener {
	t.Helper()
	e.upNS = bpftest.NewNetns(t, "10.77.0.1/32")
	return listen(t, e.self, e.upNS, upstream)
}

func snapshot(t testing.TB, w witness.Witness, c *net.TCPConn) witness.Counters {
	t.Helper()
	ctr, err := w.Snapshot(rawConn(t, c))
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return ctr
}

func TestWitnessCountsBytesSent(t *testing.T) {
	e := setup(t)
	srv := e.upstream(t)
	w := e.l.Witness()

	c, s := upstreamPair(t, e, srv, e.l.Mark())
	before := snapshot(t, w, c)
	if !before.HasBytesSent || !before.HasDataSegsOut || before.BytesSent != 0 || before.DataSegsOut != 0 || before.Source != bpfload.Source {
		t.Fatalf("before any write: %+v", before)
	}

	const n = 200000
	go func() {
		_, _ = c.Write(make([]byte, n))
	}()
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(s, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	var after witness.Counters
	// Polls: the ACKs move the kernel's and the eBPF program's counters
	// with no event a socket user can wait on.
	testenv.Poll(3*time.Second, func() bool {
		after = snapshot(t, w, c)
		return after.BytesAcked >= n
	})
	// bytes_acked also counts the SYN, as tcpi_bytes_acked does. On a loaded
	// machine a tail-loss probe may resend a segment even on loopback; sent
	// bytes count retransmissions, so they may exceed n only then.
	exact := func(got uint64) bool { return got == n || after.Retransmits > 0 && got > n }
	if !exact(after.BytesSent) || after.DataSegsOut < 1 || after.BytesAcked < n || after.NotSentBytes != 0 {
		t.Fatalf("after %d bytes: %+v", n, after)
	}
	if witness.NoByteLeft(before, after) {
		t.Fatal("NoByteLeft true although bytes left")
	}
	// The eBPF record itself counted the bytes (not only TCP_INFO).
	rec, err := w.Record(rawConn(t, c))
	if err != nil {
		t.Fatal(err)
	}
	if !exact(rec.TxBytes) || rec.TxDataSkbs < 1 || rec.AppBytes != n {
		t.Fatalf("record: tx_bytes=%d tx_data_skbs=%d app_bytes=%d, want %d", rec.TxBytes, rec.TxDataSkbs, rec.AppBytes, n)
	}
	// And agrees with the kernel's own counters.
	ti, err := witness.TCPInfo{}.Snapshot(rawConn(t, c))
	if err != nil {
		t.Fatal(err)
	}
	if ti.BytesSent != after.BytesSent || ti.DataSegsOut != after.DataSegsOut {
		t.Fatalf("ebpf %+v vs tcp_info %+v", after, ti)
	}
	t.Logf("sent %d bytes: ebpf tx_bytes=%d tx_data_skbs=%d data_segs_out=%d", n, rec.TxBytes, rec.TxDataSkbs, after.DataSegsOut)

	// A socket that sends nothing proves that nothing left.
	idle, _ := upstreamPair(t, e, srv, e.l.Mark())
	b := snapshot(t, w, idle)
	time.Sleep(50 * time.Millisecond) // not synchronisation: time without a write, in which the counters must not move
	a := snapshot(t, w, idle)
	if a.BytesSent != 0 || a.DataSegsOut != 0 || !witness.NoByteLeft(b, a) {
		t.Fatalf("idle socket: before %+v after %+v", b, a)
	}
}

func TestWitnessRecordsReset(t *testing.T) {
	e := setup(t)
	srv := e.upstream(t)
	w := e.l.Witness()
	events, err := e.l.Events()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { events.Close() })

	start := time.Now()
	c, s := upstreamPair(t, e, srv, e.l.Mark())
	cookie, err := bpfload.SocketCookie(rawConn(t, c))
	if err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, w, c)
	// The upstream resets before the client sent a single byte.
	if err := s.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// The client's read ends with the reset, after the eBPF program
	// marked it (waitReset).
	waitReset(t, c)
	after := snapshot(t, w, c)
	if !after.ResetReceived {
		t.Fatalf("no reset recorded: %+v", after)
	}
	if after.ResetAt.Before(start.Add(-time.Second)) || after.ResetAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("ResetAt %v not within the test (started %v)", after.ResetAt, start)
	}
	if after.BytesSent != 0 || !witness.NoByteLeft(before, after) {
		t.Fatalf("reset before any byte: before %+v after %+v", before, after)
	}

	// The ring buffer has the reset and the state changes of this socket.
	seen := map[bpfload.EventType]bool{}
	events.SetDeadline(time.Now().Add(3 * time.Second))
	for !seen[bpfload.EventReset] || !seen[bpfload.EventState] {
		ev, err := events.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("events seen %v; want reset and state", seen)
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Cookie != cookie {
			continue
		}
		t.Logf("event %s %d->%d tx=%d at %s", ev.Type, ev.OldState, ev.NewState, ev.TxBytes, ev.Time.Format(time.RFC3339Nano))
		seen[ev.Type] = true
	}
}

func TestWitnessIgnoresUnmarkedSockets(t *testing.T) {
	e := setup(t)
	srv := e.upstream(t)
	c, _ := upstreamPair(t, e, srv, 0)
	if _, err := e.l.Witness().Snapshot(rawConn(t, c)); !errors.Is(err, witness.ErrUnsupported) {
		t.Fatalf("unmarked socket: err = %v, want witness.ErrUnsupported", err)
	}
}

// TestWitnessRawLookupMatchesLibrary: the raw BPF_MAP_LOOKUP_ELEM that
// Snapshot makes reads the same record as cilium/ebpf's Map.Lookup, for a
// tracked socket after traffic and for an untracked one, and a snapshot
// allocates nothing.
func TestWitnessRawLookupMatchesLibrary(t *testing.T) {
	e := setup(t)
	srv := e.upstream(t)
	w := e.l.Witness()
	if !w.RawLookup() {
		t.Fatal("the witness map's value is not a Record byte for byte: no raw lookup")
	}
	c, s := upstreamPair(t, e, srv, e.l.Mark())
	if _, err := c.Write(make([]byte, 70000)); err != nil {
		t.Fatal(err)
	}
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(s, make([]byte, 70000)); err != nil {
		t.Fatal(err)
	}
	// The last ACKs in, so that the two lookups below see the same
	// record. Polls: ACKs come with no event a socket user can wait on.
	testenv.Eventually(t, 5*time.Second, "the 70000 bytes acknowledged", func() bool { return snapshot(t, w, c).BytesAcked >= 70000 })
	rc := rawConn(t, c)
	raw, err := w.Record(rc)
	if err != nil {
		t.Fatal(err)
	}
	lib, err := w.RecordViaLibrary(rc)
	if err != nil {
		t.Fatal(err)
	}
	if raw != lib || raw.TxBytes < 70000 || raw.Cookie == 0 {
		t.Fatalf("raw lookup %+v\nlibrary    %+v", raw, lib)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := w.Snapshot(rc); err != nil {
			t.Fatal(err)
		}
	}); n != 0 && !raceEnabled {
		t.Fatalf("%.0f allocations per snapshot", n)
	}

	u, _ := upstreamPair(t, e, srv, 0)
	ru := rawConn(t, u)
	_, rerr := w.Record(ru)
	_, lerr := w.RecordViaLibrary(ru)
	if !errors.Is(rerr, witness.ErrUnsupported) || !errors.Is(lerr, witness.ErrUnsupported) {
		t.Fatalf("untracked socket: raw %v, library %v", rerr, lerr)
	}
	c.Close()
	if _, err := w.Snapshot(rc); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("closed socket: %v", err)
	}
}
