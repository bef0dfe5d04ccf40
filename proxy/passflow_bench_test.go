package proxy

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"

	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/witness"
)

// BenchmarkPassthroughFlowCounting: what counting a passthrough flow
// costs a connection. Each iteration is one TLS passthrough through a
// transparent proxy on loopback: connect, a real ClientHello (with a
// server name) out, one byte back from the destination, close. counted
// has Metrics (the server name parsed, the upstream socket read at
// connect and close, the series found); uncounted has none.
//
//	go test -run '^$' -bench PassthroughFlowCounting -count 5 ./proxy/
func BenchmarkPassthroughFlowCounting(b *testing.B) {
	hello := helloOf(b, &tls.Config{ServerName: "api.example.com"})
	if helloServerName(hello) != "api.example.com" {
		b.Fatal("the ClientHello has no server name")
	}
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.ReadFull(c, make([]byte, len(hello)))
				c.Write([]byte{1})
				io.Copy(io.Discard, c)
			}()
		}
	}()
	dst := up.Addr().(*net.TCPAddr).AddrPort()
	pol, err := policy.Parse("p.yaml", []byte("upstreams:\n  - {host: api.example.com, port: "+strconv.Itoa(int(dst.Port()))+"}\n"))
	if err != nil {
		b.Fatal(err)
	}
	m, err := NewMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		m    *Metrics
	}{{"counted", m}, {"uncounted", nil}} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := New(Config{Mode: Transparent, Resolver: &StaticResolver{Dst: dst}, Policy: StaticPolicy{P: pol},
				Logger: slog.New(slog.DiscardHandler), Shared: Shared{Metrics: tc.m, Witness: witness.TCPInfo{}}})
			if err != nil {
				b.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go s.Serve(ln)
			defer s.Shutdown(context.Background())
			p := ln.Addr().String()
			one := make([]byte, 1)
			b.ResetTimer()
			for range b.N {
				c, err := net.Dial("tcp", p)
				if err != nil {
					b.Fatal(err)
				}
				c.Write(hello)
				if _, err := io.ReadFull(c, one); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

// BenchmarkHelloServerName: reading the server name of a ClientHello.
func BenchmarkHelloServerName(b *testing.B) {
	hello := helloOf(b, &tls.Config{ServerName: "api.example.com"})
	b.ReportAllocs()
	for range b.N {
		if helloServerName(hello) != "api.example.com" {
			b.Fatal("no server name")
		}
	}
}
