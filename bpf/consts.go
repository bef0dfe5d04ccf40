package bpf

// Constants mirrored from egret.h (bpf2go exports types, not #defines).
const (
	// PodConfig flags (EgretPodConfig.Flags).
	PodHasV4            = 1 << 0
	PodHasV6            = 1 << 1
	PodRedirectLoopback = 1 << 2
	// PodNoLearn: connect4/6 ignore the pod's learned-direct entries
	// (egret_direct); every connect not excluded is redirected.
	PodNoLearn = 1 << 3

	// WitnessComplete (EgretWitnessRec.Flags): the socket was tracked from
	// before its SYN, so the transmit counters saw every segment.
	WitnessComplete = 1 << 0
)

// Protocols of a learned-direct destination (EgretDirectEntry.Protocol).
const (
	DirectProtoOther       = 0
	DirectProtoTLS         = 1
	DirectProtoHTTP2       = 2
	DirectProtoServerFirst = 3
)

// Event types (EgretEvent.Type).
const (
	EventState      = 1
	EventReset      = 2
	EventRetransmit = 3
	EventRTO        = 4
)

// SOOriginalDst is the getsockopt option answered by the cgroup/getsockopt
// program at level SOL_IP (IPv4 sockaddr) and SOL_IPV6 (IPv6 sockaddr),
// the same numbers as netfilter's SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST.
const SOOriginalDst = 80

// Paths of direct pod connections (EgretFlowKey.Path): why connect4/6 left
// the connect alone.
const (
	PathPolicyPort = 1
	PathPolicyCIDR = 2
	PathLearned    = 3
	PathFailOpen   = 4
)
