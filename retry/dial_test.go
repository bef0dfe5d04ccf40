package retry

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/client"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

// fakeDNS answers every query on loopback UDP with rcode.
func fakeDNS(t *testing.T, rcode dnsmessage.RCode) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionAvailable: true, RCode: rcode})
			b.StartQuestions()
			b.Question(q)
			msg, err := b.Finish()
			if err == nil {
				pc.WriteTo(msg, from)
			}
		}
	}()
	return pc.LocalAddr().String()
}

func resolverDialer(server string) *net.Dialer {
	return &net.Dialer{Resolver: &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", server)
	}}}
}

func TestDNS(t *testing.T) {
	for _, tc := range []struct {
		rcode   dnsmessage.RCode
		want    engine.Category
		retried bool
	}{
		{dnsmessage.RCodeNameError, engine.DNSNotFound, false},
		{dnsmessage.RCodeServerFailure, engine.DNSFailure, true},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			d := resolverDialer(fakeDNS(t, tc.rcode))
			tr, _, _ := testTransport(t, nil)
			tr.Base = client.NewHTTPTransport(client.HTTPOptions{DialContext: d.DialContext})
			_, err := tr.RoundTrip(rawtest.Post(t, "http://nothing.egret-test.example:8080/", "x"))
			var e *Error
			if !errors.As(err, &e) || e.Outcome != engine.OutcomeNotSent || e.Status != 503 {
				t.Fatalf("err %v", err)
			}
			a := e.Trace.Attempts[0]
			if a.Failure != tc.want || a.Stage != StageDNS {
				t.Fatalf("attempt %+v", a)
			}
			if retried := e.Attempts > 1; retried != tc.retried {
				t.Fatalf("%d attempts", e.Attempts)
			}
			var dns *net.DNSError
			if !errors.As(err, &dns) {
				t.Fatalf("cause %v is not a *net.DNSError", err)
			}
		})
	}
}

func TestConnectTimeout(t *testing.T) {
	// A dialer that never completes, like a SYN into a black hole.
	blackhole := func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	tr, _, _ := testTransport(t, func(p *Policy) { p.AttemptTimeout = 50 * time.Millisecond })
	tr.Base = client.NewHTTPTransport(client.HTTPOptions{DialContext: blackhole})
	_, err := tr.RoundTrip(rawtest.Post(t, "http://127.0.0.1:9/", "x"))
	var e *Error
	if !errors.As(err, &e) || e.Outcome != engine.OutcomeNotSent || e.Attempts != 3 {
		t.Fatalf("err %v", err)
	}
	if a := e.Trace.Attempts[0]; a.Failure != engine.ConnectTimeout {
		t.Fatalf("attempt %+v", a)
	}
}
