// Package witness defines how the proxy asks the kernel what really happened
// to the bytes of one attempt on one upstream socket.
//
// The proxy takes a Snapshot of the upstream socket when the request write
// starts and another when the attempt fails. Only NoByteLeft(before, after),
// or EndedBeforeAck for a stream the peer ended before answering, may
// upgrade the evidence sent_no_response to not_sent (spec section 1);
// anything short of those proofs keeps sent_no_response.
//
// Implementations: TCPInfo (getsockopt TCP_INFO, Linux; the fallback), the
// eBPF witness in agent/ (socket records keyed by socket cookie), and Memory
// for tests that need no network.
package witness

import (
	"errors"
	"syscall"
	"time"
)

// ErrUnsupported is returned by Snapshot when the witness cannot observe this
// kind of connection (not TCP, or the platform has no such counters).
var ErrUnsupported = errors.New("witness: unsupported connection")

// Counters is what the kernel says about one socket at one instant.
// Counters that an implementation cannot read stay zero and the matching
// Has* flag stays false; NoByteLeft refuses to prove anything from them.
type Counters struct {
	// BytesSent counts payload bytes the socket handed to the network,
	// retransmissions included (tcpi_bytes_sent).
	BytesSent    uint64
	HasBytesSent bool
	// DataSegsOut counts data segments sent (tcpi_data_segs_out).
	DataSegsOut    uint64
	HasDataSegsOut bool
	// NotSentBytes counts bytes the socket accepted from the program but
	// has not handed to the network yet (tcpi_notsent_bytes). Such bytes
	// may still leave after the snapshot, so they void a proof unless the
	// queue was discarded (QueueDiscarded: the socket was then closed with
	// SO_LINGER 0, which drops the queue and sends RST).
	NotSentBytes    uint64
	HasNotSentBytes bool
	QueueDiscarded  bool
	// BytesAcked counts payload bytes the peer acknowledged
	// (tcpi_bytes_acked, Linux 4.0 and later: HasBytesAcked).
	BytesAcked    uint64
	HasBytesAcked bool
	// Retransmits and RTOs count retransmitted segments and RTO firings.
	Retransmits uint32
	RTOs        uint32
	// ResetReceived says the peer sent a RST; ResetAt is when, if known.
	ResetReceived bool
	ResetAt       time.Time
	// BytesReceived counts payload bytes received in order
	// (tcpi_bytes_received): beside what the program read, it tells
	// whether bytes wait unread. Linux 4.1 and later; on an older kernel
	// HasBytesReceived stays false.
	BytesReceived    uint64
	HasBytesReceived bool
	// State is the TCP state (linux TCP_* numbering), 0 if unknown.
	State uint8
	// Source names the implementation that produced the counters.
	Source string
}

// StateEstablished is Counters.State of an established connection (linux
// TCP_ESTABLISHED); any other known state of a connection that carried
// data means the peer closed or reset it.
const StateEstablished = 1

// StateClose is Counters.State of a connection that was reset (linux
// TCP_CLOSE), before our side closed it.
const StateClose = 7

// Witness observes upstream sockets.
type Witness interface {
	// Snapshot reads the counters of the socket behind c.
	Snapshot(c syscall.RawConn) (Counters, error)
}

// NoByteLeft reports whether the two snapshots prove that no byte was sent on
// the socket between them: the sent-byte counter and the data-segment counter
// are both readable in both snapshots and neither moved. When the after
// snapshot knows the send queue, bytes still queued (which could leave
// later) void the proof unless the queue was discarded.
func NoByteLeft(before, after Counters) bool {
	if !before.HasBytesSent || !after.HasBytesSent || !before.HasDataSegsOut || !after.HasDataSegsOut {
		return false
	}
	if after.HasNotSentBytes && after.NotSentBytes > 0 && !after.QueueDiscarded {
		return false
	}
	return before.BytesSent == after.BytesSent && before.DataSegsOut == after.DataSegsOut
}

// EndedBeforeAck reports whether the two snapshots prove that the peer
// ended its side of the connection before any byte sent between them
// reached it, and then refused them. The caller must know that the peer's
// FIN was read before any byte of an answer (an end of stream), and take
// after once the connection failed, before closing it. The proof:
//
//   - the FIN carries the peer's cumulative ACK, which the kernel
//     processes: had any byte sent since before reached the peer's kernel
//     by the time it sent the FIN, the acked-byte counter would have moved.
//     It did not, and the received-byte counter moved by exactly one: the
//     FIN's sequence number (tcpi_bytes_received follows rcv_nxt), no data;
//   - the connection is now reset (state CLOSE): the peer's kernel answered
//     those bytes with a RST, as it does for data reaching a socket closed
//     for reading, whereas a peer that only half-closed would have taken
//     and acknowledged them.
//
// A RST alone proves nothing: the kernel ignores the ACK a RST carries,
// and a peer that read the request and then reset often has not sent its
// (delayed) ACK yet, so "nothing acked" is what a request that was read
// and executed looks like too.
func EndedBeforeAck(before, after Counters) bool {
	if !before.HasBytesAcked || !after.HasBytesAcked || !before.HasBytesReceived || !after.HasBytesReceived {
		return false
	}
	return after.State == StateClose && before.BytesAcked == after.BytesAcked &&
		after.BytesReceived == before.BytesReceived+1
}
