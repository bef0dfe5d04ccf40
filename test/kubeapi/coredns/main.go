// Command coredns is CoreDNS (github.com/coredns/coredns, from the Go
// module proxy) with only the plugins test/kubenode's cluster DNS uses:
// kubernetes (Services and pods of cluster.local from the apiserver),
// cache, errors, log, health and ready. CoreDNS's own main package links
// every plugin it has (cloud DNS providers, tracing, dnstap...), which
// costs minutes of a cold build and tens of megabytes for nothing here;
// this is the "own main" CoreDNS documents for choosing plugins at compile
// time. Its Corefile directives keep CoreDNS's order
// (dnsserver.Directives).
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
