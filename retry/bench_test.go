package retry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/egret-proxy/egret/retry/client"
)

// BenchmarkTransport compares keep-alive GETs over loopback through
// Transport (on client.NewHTTPTransport) with the bare http.Transport.
func BenchmarkTransport(b *testing.B) {
	body := make([]byte, 512)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) }))
	defer srv.Close()
	run := func(b *testing.B, rt http.RoundTripper) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			resp, err := rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	b.Run("bare", func(b *testing.B) {
		t := &http.Transport{MaxIdleConnsPerHost: 64}
		defer t.CloseIdleConnections()
		run(b, t)
	})
	b.Run("egret", func(b *testing.B) {
		base := client.NewHTTPTransport(client.HTTPOptions{})
		defer base.CloseIdleConnections()
		run(b, &Transport{Base: base})
	})
	// interleaved alternates the two on the same server so that machine
	// noise hits both alike; it reports the ratio of their mean latencies.
	// "interleaved-deadline" gives every request (both sides) a 15 s
	// deadline, as a careful caller does: then Transport needs no timer of
	// its own for DefaultPolicy's 15 s timeout.
	for _, withDeadline := range []bool{false, true} {
		name := "interleaved"
		if withDeadline {
			name += "-deadline"
		}
		b.Run(name, func(b *testing.B) {
			bare := &http.Transport{MaxIdleConnsPerHost: 64}
			defer bare.CloseIdleConnections()
			base := client.NewHTTPTransport(client.HTTPOptions{})
			defer base.CloseIdleConnections()
			eg := &Transport{Base: base}
			req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			one := func(rt http.RoundTripper) time.Duration {
				start := time.Now()
				r := req
				if withDeadline {
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					defer cancel()
					r = req.WithContext(ctx)
				}
				resp, err := rt.RoundTrip(r)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return time.Since(start)
			}
			var tb, te time.Duration
			n := 0
			for b.Loop() {
				if n%2 == 0 {
					tb += one(bare)
					te += one(eg)
				} else {
					te += one(eg)
					tb += one(bare)
				}
				n++
			}
			b.ReportMetric(float64(tb.Nanoseconds())/float64(n), "bare-ns/req")
			b.ReportMetric(float64(te.Nanoseconds())/float64(n), "egret-ns/req")
			b.ReportMetric(float64(te)/float64(tb), "egret/bare")
		})
	}
	b.Run("egret+tcp_info", func(b *testing.B) {
		base := client.NewHTTPTransport(client.HTTPOptions{})
		defer base.CloseIdleConnections()
		run(b, &Transport{Base: base, Witness: tcpInfoForBench()})
	})
}

// BenchmarkTransportH2C runs keep-alive GETs over h2c (HTTP/2 with prior
// knowledge) on loopback through Transport on client.NewHTTPTransport's HTTP/2
// pool, beside a bare net/http Transport speaking h2c to the same server.
func BenchmarkTransportH2C(b *testing.B) {
	body := make([]byte, 512)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) }))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	run := func(b *testing.B, rt http.RoundTripper) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			resp, err := rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
			if resp.ProtoMajor != 2 {
				b.Fatalf("proto %s, want HTTP/2", resp.Proto)
			}
		}
	}
	b.Run("bare", func(b *testing.B) {
		t := &http.Transport{Protocols: new(http.Protocols)}
		t.Protocols.SetUnencryptedHTTP2(true)
		defer t.CloseIdleConnections()
		run(b, t)
	})
	b.Run("egret", func(b *testing.B) {
		base := client.NewHTTPTransport(client.HTTPOptions{H2C: true})
		defer base.CloseIdleConnections()
		run(b, &Transport{Base: base})
	})
}
