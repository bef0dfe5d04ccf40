package witness

// TCPInfo is the fallback witness: it reads the socket's counters with
// getsockopt(TCP_INFO). It is supported on Linux only; elsewhere Snapshot
// returns ErrUnsupported.
//
// A counter is reported (Has* set) only when the kernel's answer is long
// enough to contain it, so an old kernel that lacks tcpi_bytes_sent can never
// make NoByteLeft prove anything.
type TCPInfo struct{}

// compile-time check that TCPInfo is a Witness.
var _ Witness = TCPInfo{}

// sourceTCPInfo names TCPInfo in Counters.Source.
const sourceTCPInfo = "tcp_info"
