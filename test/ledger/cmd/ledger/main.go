// Command ledger runs the ledger upstream on its own, for demos and for
// tests in another process or network namespace:
//
//	go run ./test/ledger/cmd/ledger -listen 127.0.0.1:8080 [-tls 127.0.0.1:8443 -ca ca.pem]
//	curl -x http://127.0.0.1:15001 -H 'Ledger-Id: a' -H 'Ledger-Fault: 503; times=1' -i http://127.0.0.1:8080/
//	curl http://127.0.0.1:8080/_ledger/records/a
//
// It serves HTTP/1.1 and h2c on -listen (and TLS with ALPN on -tls, writing
// its CA to -ca), answers /_ledger/ introspection, and exits on SIGINT or
// SIGTERM.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/egret-proxy/egret/test/ledger"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address for HTTP/1.1 and h2c")
	tlsAddr := flag.String("tls", "", "address for TLS (ALPN h2, http/1.1); empty: none")
	caFile := flag.String("ca", "", "write the TLS listener's CA (PEM) to this file")
	flag.Parse()
	s := ledger.New()
	s.Introspect = true
	a, err := s.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		os.Exit(1)
	}
	fmt.Println("ledger listening on", a, "(HTTP/1.1 and h2c)")
	if *tlsAddr != "" {
		ta, err := s.ListenTLS("tcp", *tlsAddr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "ledger:", err)
			os.Exit(1)
		}
		fmt.Println("ledger listening on", ta, "(TLS, ALPN h2 and http/1.1)")
		if *caFile != "" {
			pem, _ := s.CAPEM()
			if err := os.WriteFile(*caFile, pem, 0o644); err != nil {
				fmt.Fprintln(os.Stderr, "ledger:", err)
				os.Exit(1)
			}
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	st := s.Stats()
	fmt.Printf("ledger: %d arrivals, %d executions, %d key replays\n", st.Arrivals, st.Executions, st.Replays)
	s.Close()
}
