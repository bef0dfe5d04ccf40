package truth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
	"github.com/egret-proxy/egret/test/ledger"
	"github.com/egret-proxy/egret/witness"
)

// upstreams is a ledger served several ways: HTTP/1.1 (IPv4 and IPv6), h2c,
// h2 and HTTP/1.1 over TLS, and a port that refuses every connect.
type upstreams struct {
	ledger  *ledger.Server
	h1      net.Addr
	h1v6    net.Addr // HTTP/1.1 on [::1] (nil without IPv6 loopback)
	h2c     net.Addr
	tls     net.Addr // h2 over TLS
	tlsH1   net.Addr // HTTP/1.1 over TLS
	refused *ledger.Refuser
	caFile  string
}

func startUpstreams(t *testing.T) *upstreams {
	t.Helper()
	u := &upstreams{}
	var err error
	u.ledger, u.h1 = ledger.Start(t)
	if u.h2c, err = u.ledger.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if a, err := u.ledger.Listen("tcp6", "[::1]:0"); err == nil {
		u.h1v6 = a
	} else {
		t.Logf("no IPv6 loopback (%v): HTTP/1.1 over 127.0.0.1 instead", err)
		u.h1v6 = u.h1
	}
	if u.tls, err = u.ledger.ListenTLS("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if u.tlsH1, err = u.ledger.ListenTLS("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if u.refused, err = ledger.Refusing(net.IPv4(127, 0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.refused.Close() })
	pem, err := u.ledger.CAPEM()
	if err != nil {
		t.Fatal(err)
	}
	u.caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(u.caFile, pem, 0o600); err != nil {
		t.Fatal(err)
	}
	return u
}

func port(a net.Addr) int { return a.(*net.TCPAddr).Port }

// policyFor writes the test policy: defaults (HTTP/1.1) plus the h2c and the
// TLS h2 ports of u. defaults is the YAML body of the defaults block.
func (u *upstreams) policyFor(defaults string) string {
	var b strings.Builder
	b.WriteString("defaults:\n")
	for _, l := range strings.Split(strings.TrimSpace(defaults), "\n") {
		b.WriteString("  " + l + "\n")
	}
	fmt.Fprintf(&b, "upstreams:\n  - host: 127.0.0.1\n    port: %d\n    protocol: h2c\n", port(u.h2c))
	fmt.Fprintf(&b, "  - host: 127.0.0.1\n    port: %d\n    protocol: h2\n    tls:\n      enabled: true\n      ca_file: %s\n", port(u.tls), u.caFile)
	fmt.Fprintf(&b, "  - host: 127.0.0.1\n    port: %d\n    protocol: http1\n    tls:\n      enabled: true\n      ca_file: %s\n", port(u.tlsH1), u.caFile)
	return b.String()
}

// startEgret runs an egret proxy in explicit mode on loopback with the
// policy document and returns its URL.
func startEgret(t *testing.T, doc string) (*url.URL, *proxy.Traces) {
	t.Helper()
	pol, err := policy.Parse("truth-policy.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("policy: %v\n%s", err, doc)
	}
	srv, err := proxy.New(proxy.Config{
		Mode:   proxy.Explicit,
		Policy: proxy.StaticPolicy{P: pol},
		Shared: proxy.Shared{Witness: witness.TCPInfo{}},
		// Every request's trace is kept, for the report of a violation.
		Traces: proxy.NewTraces(1 << 15),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	})
	return &url.URL{Scheme: "http", Host: ln.Addr().String()}, srv.Traces()
}

// explainer tells egret's trace of a request in one line per attempt.
func explainer(traces *proxy.Traces) func(string) string {
	return func(id string) string {
		tr, ok := traces.Get(id)
		if !ok {
			return "none kept"
		}
		var b strings.Builder
		fmt.Fprintf(&b, "outcome %s", tr.Outcome)
		for _, at := range tr.Attempts {
			fmt.Fprintf(&b, "\n      attempt %d after %v: stage %s, failure %s, evidence %s, status %d, decision %s (%s)",
				at.N, at.Duration.Round(time.Millisecond), at.Stage, at.Failure, at.Evidence, at.Status,
				at.Decision.Decision, at.Decision.Reason)
			if at.Upgraded {
				b.WriteString(", upgraded by the witness")
			}
			if at.WitnessAfter.Source != "" {
				fmt.Fprintf(&b, " [sent %d->%d, acked %d->%d, state %d]", at.WitnessBefore.BytesSent, at.WitnessAfter.BytesSent,
					at.WitnessBefore.BytesAcked, at.WitnessAfter.BytesAcked, at.WitnessAfter.State)
			}
			if at.Err != "" {
				fmt.Fprintf(&b, ": %s", at.Err)
			}
		}
		return b.String()
	}
}

// client talks to egret as an HTTP_PROXY. Its own transport never retries
// unseen: every connection it takes for a request is counted.
func client(proxyURL *url.URL, conns int) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:               http.ProxyURL(proxyURL),
			MaxIdleConns:        conns,
			MaxIdleConnsPerHost: conns,
			DisableCompression:  true,
			IdleConnTimeout:     30 * time.Second,
		},
		Timeout: 20 * time.Second,
	}
}

// answer is what the client saw for one request.
type answer struct {
	status    int
	outcome   string // Egret-Outcome
	attempts  int    // Egret-Attempts; -1 if absent or malformed
	requestID string
	bodySHA   string // Ledger-Body-Sha256 of a ledger answer
	replayed  bool
	err       error // no answer (transport error)
	bodyErr   error // the answer's body broke
	gotConns  int   // connections the client's transport took
	elapsed   time.Duration
}

// do sends req and reads the whole answer.
func do(c *http.Client, req *http.Request) answer {
	var a answer
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { a.gotConns++ }}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		a.err = err
		a.elapsed = time.Since(start)
		return a
	}
	defer resp.Body.Close()
	a.status = resp.StatusCode
	a.outcome = resp.Header.Get(proxy.HeaderOutcome)
	a.requestID = resp.Header.Get(proxy.HeaderRequestID)
	a.attempts = -1
	if v := resp.Header.Get(proxy.HeaderAttempts); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			a.attempts = n
		}
	}
	a.bodySHA = resp.Header.Get(ledger.HeaderBodySHA256)
	a.replayed = resp.Header.Get(ledger.HeaderReplayed) == "1"
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("body: %d of %d bytes", n, resp.ContentLength)
	}
	if err != nil {
		a.bodyErr = err
		if errors.Is(err, io.EOF) {
			a.bodyErr = io.ErrUnexpectedEOF
		}
	}
	a.elapsed = time.Since(start)
	return a
}
