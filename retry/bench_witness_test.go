package retry

import "github.com/egret-proxy/egret/proxy/witness"

func tcpInfoForBench() witness.Witness { return witness.TCPInfo{} }
