package proxy

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egret-proxy/egret/witness"
)

// What egret passes through, it still observes. A transparent connection
// egret does not proxy as HTTP (TLS, HTTP/2, PostgreSQL, Redis, unknown, a
// destination that speaks first, the pod's own forward proxy) is carried
// byte for byte on an upstream socket egret dials itself, so egret sees
// how that flow ended: the dial refused, timed out or unreachable, or the
// connection established and later reset by the destination, before any
// byte egret sent for the pod was acknowledged or after some were (read
// from the upstream socket's kernel counters, Config.Witness, when the
// reset is seen). Each outcome is counted per pod, protocol and
// destination class, with the evidence class the failure would have had
// had egret proxied the flow as requests: not_sent (a retry was safe
// whatever the method) or sent_no_response (ambiguous for a non-idempotent
// request). One count per connection, never per byte or packet.
//
// Destinations are labelled only by what the operator named, so that the
// series stay bounded however many addresses a pod reaches: a policy entry
// (by the TLS ClientHello's server name, then by address), a Kubernetes
// Service (Config.Services; these take places under the per-workload
// series' cap of unnamed upstreams), else "other".

// flowOutcome indexes the counters of a passthrough flow series.
type flowOutcome uint8

const (
	flowConnects flowOutcome = iota
	flowEstablished
	flowRefused
	flowTimedOut
	flowUnreachable
	flowDialFailed // any other dial error
	flowResetBeforeAck
	flowResetAfterAck
	numFlowOutcomes
)

// flowOutcomes names the outcome label of each flowOutcome and the
// evidence class of the failures ("" for connects and established).
var flowOutcomes = [numFlowOutcomes]struct{ name, evidence string }{
	flowConnects:    {"connects", ""},
	flowEstablished: {"established", ""},
	flowRefused:     {"refused", evidenceNotSent},
	flowTimedOut:    {"timed_out", evidenceNotSent},
	flowUnreachable: {"unreachable", evidenceNotSent},
	flowDialFailed:  {"dial_failed", evidenceNotSent},
	// A reset before any byte was acked proves nothing: a destination
	// that read what was sent and reset before its delayed ACK leaves the
	// acked count where it was (bpfload.FlowStats.Failures).
	flowResetBeforeAck: {"reset_before_ack", evidenceSentNoResponse},
	flowResetAfterAck:  {"reset_after_ack", evidenceSentNoResponse},
}

// Evidence classes, the retry package's names (as the agent's direct
// flows use them).
const (
	evidenceNotSent        = "not_sent"
	evidenceSentNoResponse = "sent_no_response"
)

// dialOutcome is the flow outcome of a failed passthrough dial, from its
// reason (dialFailure).
func dialOutcome(reason string) flowOutcome {
	switch reason {
	case "refused":
		return flowRefused
	case "timeout":
		return flowTimedOut
	case "unreachable":
		return flowUnreachable
	}
	return flowDialFailed
}

type flowKey struct {
	ns, pod, workload string
	proto             Protocol
	dest              string
}

// flowSeries are the counters of one pod, protocol and destination.
type flowSeries struct {
	last atomic.Int64 // unix nanoseconds of the last flow begun or ended
	open atomic.Int64 // flows established and not yet closed: kept while > 0
	// retrans and segs sum the closed flows' retransmitted segments
	// (SYNs included) and data segments sent, read from the socket as it
	// closes: their ratio is the retransmission rate.
	retrans, segs atomic.Uint64
	n             [numFlowOutcomes]atomic.Uint64
}

// passFlows is the collector of egret_proxy_passthrough_flows_total. A
// series lives while one of its flows is open or it counted something
// within the workloads' TTL, and goes with its pod (forget).
type passFlows struct {
	w         *workloads // the clock, TTL and the cap of unnamed labels
	mu        sync.Mutex
	m         map[flowKey]*flowSeries
	nextSweep int64
	desc      *prometheus.Desc
	retrans   *prometheus.Desc
	segs      *prometheus.Desc
}

func newPassFlows(w *workloads) *passFlows {
	return &passFlows{w: w, m: map[flowKey]*flowSeries{},
		desc: prometheus.NewDesc("egret_proxy_passthrough_flows_total",
			"Transparent connections egret passed through (not retried), by source pod, detected protocol, destination (a policy entry, by the TLS server name or the address; a Kubernetes Service; else \"other\") and outcome: connects (dials), established, refused, timed_out, unreachable, dial_failed, reset_before_ack and reset_after_ack (reset by the destination before or after any byte egret sent for the pod was acknowledged, as the kernel counted on egret's upstream socket), each failure with the evidence class it would have had had egret proxied it (not_sent: a retry was safe; sent_no_response: ambiguous for non-idempotent requests).",
			[]string{"source_namespace", "source_pod", "source_workload", "protocol", "destination", "outcome", "evidence"}, nil),
		retrans: prometheus.NewDesc("egret_proxy_passthrough_retransmits_total",
			"Retransmitted segments (SYNs included) of egret's upstream sockets of passthrough flows, summed as they close, by source pod, protocol and destination (as egret_proxy_passthrough_flows_total).",
			[]string{"source_namespace", "source_pod", "source_workload", "protocol", "destination"}, nil),
		segs: prometheus.NewDesc("egret_proxy_passthrough_segments_total",
			"Data segments sent by egret's upstream sockets of passthrough flows, summed as they close (retransmission rate: retransmits / segments), by source pod, protocol and destination.",
			[]string{"source_namespace", "source_pod", "source_workload", "protocol", "destination"}, nil),
	}
}

// label is the destination label of dest: itself when named by the
// policy, or when a place under the cap is free for it; else "other".
func (w *workloads) label(dest string, named bool) string {
	if dest == OtherUpstream {
		return dest
	}
	now := w.now().UnixNano()
	w.mu.RLock()
	held := w.unnamed
	if named {
		held = w.named
	}
	t, ok := held[dest]
	if ok {
		t.Store(now)
	}
	w.mu.RUnlock()
	if ok {
		return dest
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.upstreamLabelLocked(dest, named, now)
}

// series returns the series of src's flows of proto to dest (named: by
// the policy), made on first use.
func (f *passFlows) series(src Source, proto Protocol, dest string, named bool) *flowSeries {
	k := flowKey{src.Namespace, src.Pod, src.Workload, proto, f.w.label(dest, named)}
	now := f.w.now().UnixNano()
	f.mu.Lock()
	defer f.mu.Unlock()
	if now >= f.nextSweep {
		f.sweepLocked(now)
		f.nextSweep = now + int64(f.w.ttl/2)
	}
	s := f.m[k]
	if s == nil {
		s = &flowSeries{}
		f.m[k] = s
	}
	s.last.Store(now)
	return s
}

func (f *passFlows) add(s *flowSeries, o flowOutcome) {
	s.n[o].Add(1)
	s.last.Store(f.w.now().UnixNano())
}

// sweepLocked drops the series idle past the TTL with no flow open.
func (f *passFlows) sweepLocked(now int64) {
	cut := now - int64(f.w.ttl)
	for k, s := range f.m {
		if s.open.Load() <= 0 && s.last.Load() <= cut {
			delete(f.m, k)
		}
	}
}

func (f *passFlows) forget(src Source) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range f.m {
		if k.ns == src.Namespace && k.pod == src.Pod {
			delete(f.m, k)
		}
	}
}

// snapshot returns the series held now, swept first.
func (f *passFlows) snapshot() ([]flowKey, []*flowSeries) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sweepLocked(f.w.now().UnixNano())
	keys := make([]flowKey, 0, len(f.m))
	ss := make([]*flowSeries, 0, len(f.m))
	for k, s := range f.m {
		keys = append(keys, k)
		ss = append(ss, s)
	}
	return keys, ss
}

func (f *passFlows) Describe(ch chan<- *prometheus.Desc) {
	ch <- f.desc
	ch <- f.retrans
	ch <- f.segs
}

func (f *passFlows) Collect(ch chan<- prometheus.Metric) {
	keys, ss := f.snapshot()
	for i, k := range keys {
		for o := range numFlowOutcomes {
			ch <- prometheus.MustNewConstMetric(f.desc, prometheus.CounterValue, float64(ss[i].n[o].Load()),
				k.ns, k.pod, k.workload, string(k.proto), k.dest, flowOutcomes[o].name, flowOutcomes[o].evidence)
		}
		ch <- prometheus.MustNewConstMetric(f.retrans, prometheus.CounterValue, float64(ss[i].retrans.Load()),
			k.ns, k.pod, k.workload, string(k.proto), k.dest)
		ch <- prometheus.MustNewConstMetric(f.segs, prometheus.CounterValue, float64(ss[i].segs.Load()),
			k.ns, k.pod, k.workload, string(k.proto), k.dest)
	}
}

// PassthroughCounts are the counters of one pod's passthrough flows of one
// protocol to one destination label, as egret_proxy_passthrough_flows_total
// says them now: for the admin API's summary and the node page.
type PassthroughCounts struct {
	Source      Source
	Protocol    Protocol
	Destination string
	Connects    uint64
	Established uint64
	Refused     uint64
	TimedOut    uint64
	Unreachable uint64
	DialFailed  uint64
	// Resets by the destination after the connection was established,
	// before any byte egret sent for the pod was acknowledged (not_sent)
	// and after some were (sent_no_response).
	ResetBeforeAck uint64
	ResetAfterAck  uint64
	// Retransmits and SegsOut of the flows closed so far.
	Retransmits, SegsOut uint64
}

// SafeToRetry is the failures whose evidence is not_sent: a retry could
// have fixed them safely, whatever the request.
func (c PassthroughCounts) SafeToRetry() uint64 {
	return c.Refused + c.TimedOut + c.Unreachable + c.DialFailed
}

// Ambiguous is the failures whose evidence is sent_no_response: a retry
// was safe only for an idempotent request.
func (c PassthroughCounts) Ambiguous() uint64 {
	return c.ResetBeforeAck + c.ResetAfterAck
}

// PassthroughCounts returns the counters of every passthrough flow series
// held now, by namespace, pod, protocol and destination.
func (m *Metrics) PassthroughCounts() []PassthroughCounts {
	if m == nil {
		return nil
	}
	keys, ss := m.flows.snapshot()
	out := make([]PassthroughCounts, 0, len(keys))
	for i, k := range keys {
		n := &ss[i].n
		out = append(out, PassthroughCounts{
			Source:   Source{Namespace: k.ns, Pod: k.pod, Workload: k.workload},
			Protocol: k.proto, Destination: k.dest,
			Connects: n[flowConnects].Load(), Established: n[flowEstablished].Load(),
			Refused: n[flowRefused].Load(), TimedOut: n[flowTimedOut].Load(),
			Unreachable: n[flowUnreachable].Load(), DialFailed: n[flowDialFailed].Load(),
			ResetBeforeAck: n[flowResetBeforeAck].Load(), ResetAfterAck: n[flowResetAfterAck].Load(),
			Retransmits: ss[i].retrans.Load(), SegsOut: ss[i].segs.Load(),
		})
	}
	slices.SortFunc(out, func(a, b PassthroughCounts) int {
		return cmp.Or(a.Source.cmpPod(b.Source), cmp.Compare(a.Protocol, b.Protocol), strings.Compare(a.Destination, b.Destination))
	})
	return out
}

// flowConn is the upstream socket of a passthrough. It watches its own
// reads and writes for a reset by the destination and, the moment one is
// seen (before anyone closes the socket), asks the witness whether any
// byte sent on it was acknowledged. Its counts go to a series once the
// flow's protocol and destination are known (commit); a reset seen
// before is counted then.
type flowConn struct {
	net.Conn
	m    *Metrics
	wit  witness.Witness
	base witness.Counters // when connected

	resetSeen atomic.Bool // the first reset is the one counted
	closeOnce sync.Once
	mu        sync.Mutex
	series    *flowSeries // nil until commit
	reset     flowOutcome // flowResetBeforeAck or flowResetAfterAck; 0: none yet
}

func (f *flowConn) Read(p []byte) (int, error) {
	n, err := f.Conn.Read(p)
	if err != nil {
		f.failed(err)
	}
	return n, err
}

func (f *flowConn) Write(p []byte) (int, error) {
	n, err := f.Conn.Write(p)
	if err != nil {
		f.failed(err)
	}
	return n, err
}

// CloseWrite half-closes the socket (pipe's half-close).
func (f *flowConn) CloseWrite() error {
	if cw, ok := f.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return f.Conn.Close()
}

// Close closes the socket; a committed flow is no longer open, and its
// retransmissions and data segments, read from the socket first, are
// added to its series.
func (f *flowConn) Close() error {
	f.closeOnce.Do(func() {
		f.mu.Lock()
		s := f.series
		f.mu.Unlock()
		if s == nil {
			return
		}
		if ctr, ok := f.snapshot(); ok {
			s.retrans.Add(uint64(ctr.Retransmits))
			if ctr.HasDataSegsOut {
				s.segs.Add(ctr.DataSegsOut)
			}
		}
		s.open.Add(-1)
	})
	return f.Conn.Close()
}

// newFlowConn watches up, a passthrough's upstream socket just
// connected: the witness's acked-byte count now (the handshake's SYN is
// counted by Linux as one byte acked) is the base a reset is judged
// against.
func newFlowConn(up net.Conn, m *Metrics, wit witness.Witness) *flowConn {
	f := &flowConn{Conn: up, m: m, wit: wit}
	if m != nil { // nothing is counted without metrics
		f.base, _ = f.snapshot()
	}
	return f
}

// snapshot reads the socket's counters; false when the witness cannot.
func (f *flowConn) snapshot() (witness.Counters, bool) {
	sc, ok := f.Conn.(syscall.Conn)
	if !ok || f.wit == nil {
		return witness.Counters{}, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return witness.Counters{}, false
	}
	ctr, err := f.wit.Snapshot(rc)
	return ctr, err == nil
}

// isReset: err says the destination reset the connection (a write after
// the reset was reported by a read fails with EPIPE).
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// failed classifies the first reset seen on the socket. The socket is
// still open here (whoever closes it does so after this returns, or its
// descriptor outlives the snapshot), so the kernel's counters are there.
// A reset whose counters cannot be read is counted after ack: nothing
// proves that no byte was delivered.
func (f *flowConn) failed(err error) {
	if f.m == nil || !isReset(err) || !f.resetSeen.CompareAndSwap(false, true) {
		return
	}
	o := flowResetAfterAck
	if ctr, ok := f.snapshot(); ok && f.base.HasBytesAcked && ctr.HasBytesAcked && ctr.BytesAcked == f.base.BytesAcked {
		o = flowResetBeforeAck
	}
	f.mu.Lock()
	f.reset = o
	s := f.series
	f.mu.Unlock()
	if s != nil {
		f.m.flows.add(s, o)
	}
}

// commit counts the flow, established, under src, proto and dest (named:
// by the policy), with the reset seen so far if any.
func (f *flowConn) commit(src Source, proto Protocol, dest string, named bool) {
	if f.m == nil {
		return
	}
	s := f.m.flows.series(src, proto, dest, named)
	s.open.Add(1)
	f.m.flows.add(s, flowConnects)
	f.m.flows.add(s, flowEstablished)
	f.mu.Lock()
	f.series = s
	r := f.reset
	f.mu.Unlock()
	if r != 0 {
		f.m.flows.add(s, r)
	}
}

// passthroughDialFlow counts a passthrough dial that failed with err. A
// dial whose connection the destination reset as soon as it was
// established (connect(2) reports the reset: ECONNRESET, where a refusal
// is ECONNREFUSED) is a flow established and reset before any byte.
func (m *Metrics) passthroughDialFlow(src Source, proto Protocol, dest string, named bool, err error) {
	if m == nil {
		return
	}
	s := m.flows.series(src, proto, dest, named)
	m.flows.add(s, flowConnects)
	if errors.Is(err, syscall.ECONNRESET) {
		m.flows.add(s, flowEstablished)
		m.flows.add(s, flowResetBeforeAck)
		return
	}
	m.flows.add(s, dialOutcome(dialFailure(err)))
}

// flowDest is the destination label of the connection's passthrough
// flows and whether the policy names it: the policy entry the TLS server
// name sni (if any) matches on the destination's port, else the Service
// the destination is, else the entry for its address, else "other". An
// entry whose name the policy fixes is labelled by it; another (a
// wildcard, an entry without a port) by its pattern, never by the
// destination, so that a pod cannot make a label per name it sends.
func (c *conn) flowDest(sni string) (string, bool) {
	cfg := &c.s.cfg
	if cfg.Mode != Transparent || !c.dst.IsValid() {
		return OtherUpstream, false
	}
	pol := cfg.Policy.Current()
	port := int(c.dst.Port())
	entry := func(host string) (string, bool) {
		up := pol.Match(host, port)
		if up.Host == "" {
			return "", false // the defaults: no name of the operator's
		}
		if up.Named() {
			return up.Name, true
		}
		return up.Pattern(), true
	}
	if sni != "" {
		if l, ok := entry(sni); ok {
			return l, true
		}
	}
	if cfg.Services != nil {
		if svc, sport, _, _, ok := cfg.Services.Service(c.dst, sni); ok {
			return svc + ":" + strconv.Itoa(int(sport)), false
		}
	}
	if l, ok := entry(c.dstHost); ok {
		return l, true
	}
	return OtherUpstream, false
}

// helloWait bounds the wait for the rest of a ClientHello whose first
// bytes were sniffed.
const helloWait = 100 * time.Millisecond

// clientHelloSNI returns the server name of the TLS ClientHello at the
// head of br (buffered, not consumed: it is passed on as it came), "" if
// it has none or is not all there within helloWait. Only the first TLS
// record is read, at most br's size.
func clientHelloSNI(nc net.Conn, br *bufio.Reader) string {
	nc.SetReadDeadline(time.Now().Add(helloWait))
	defer nc.SetReadDeadline(time.Time{})
	hdr, err := br.Peek(5)
	if err != nil || hdr[0] != 0x16 {
		return ""
	}
	n := min(5+int(binary.BigEndian.Uint16(hdr[3:5])), br.Size())
	b, _ := br.Peek(n) // short when the deadline ended the wait
	return helloServerName(b)
}

// helloServerName returns the server name (RFC 6066 server_name,
// host_name) of the ClientHello that begins the TLS record b, "" when
// there is none or b is not all of it. It reads the bytes in place (a
// passthrough pays no more than finding the extension), and returns what
// crypto/tls's own parser would (TestClientHelloSNI, FuzzHelloServerName).
func helloServerName(b []byte) string {
	// The record: handshake (22), version, length.
	if len(b) < 5 || b[0] != 0x16 {
		return ""
	}
	rec := b[5:min(len(b), 5+int(binary.BigEndian.Uint16(b[3:5])))]
	// The handshake message: client_hello (1), 24-bit length.
	if len(rec) < 4 || rec[0] != 1 {
		return ""
	}
	n := int(rec[1])<<16 | int(rec[2])<<8 | int(rec[3])
	if len(rec) < 4+n {
		return "" // continued in the next record: not all here
	}
	r := helloReader(rec[4 : 4+n])
	if !r.skip(2+32) || !r.skip8() || !r.skip16() || !r.skip8() {
		return ""
	}
	exts, ok := r.read16()
	if !ok {
		return ""
	}
	for len(exts) > 0 {
		typ, ok1 := exts.uint16()
		data, ok2 := exts.read16()
		if !ok1 || !ok2 {
			return ""
		}
		if typ != 0 { // server_name
			continue
		}
		list, ok := data.read16()
		if !ok || len(list) == 0 {
			return ""
		}
		name := ""
		for len(list) > 0 {
			nameType := list[0]
			list = list[1:]
			v, ok := list.read16()
			if !ok || len(v) == 0 {
				return ""
			}
			if nameType != 0 {
				continue
			}
			if name != "" || v[len(v)-1] == '.' {
				return "" // two host names, or a trailing dot: refused
			}
			name = string(v)
		}
		return name
	}
	return ""
}

// helloReader is what is left to read of a ClientHello.
type helloReader []byte

func (h *helloReader) skip(n int) bool {
	if len(*h) < n {
		return false
	}
	*h = (*h)[n:]
	return true
}

func (h *helloReader) uint16() (uint16, bool) {
	if len(*h) < 2 {
		return 0, false
	}
	v := binary.BigEndian.Uint16(*h)
	*h = (*h)[2:]
	return v, true
}

// skip8 and skip16 skip a vector with an 8- or 16-bit length.
func (h *helloReader) skip8() bool {
	return len(*h) >= 1 && h.skip(1+int((*h)[0]))
}

func (h *helloReader) skip16() bool {
	_, ok := h.read16()
	return ok
}

// read16 reads a vector with a 16-bit length.
func (h *helloReader) read16() (helloReader, bool) {
	n, ok := h.uint16()
	if !ok || len(*h) < int(n) {
		return nil, false
	}
	v := (*h)[:n]
	*h = (*h)[n:]
	return v, true
}
