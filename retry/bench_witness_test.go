package retry

import "github.com/egret-proxy/egret/witness"

func tcpInfoForBench() witness.Witness { return witness.TCPInfo{} }
