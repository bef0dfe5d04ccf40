package retry

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/egret-proxy/egret/engine"
	"github.com/egret-proxy/egret/retry/client"
	"github.com/egret-proxy/egret/retry/internal/rawtest"
)

func h2cTransport(t *testing.T) *Transport {
	tr, _, _ := testTransport(t, nil)
	base := client.NewHTTPTransport(client.HTTPOptions{H2C: true})
	t.Cleanup(base.CloseIdleConnections)
	tr.Base = base
	return tr
}

// TestH2CRefusalRetriedForPOST: REFUSED_STREAM, and a GOAWAY whose
// last-stream-id is below the stream (with and without an error code), prove
// the POST never ran: it is retried as not_sent and executed once. A GOAWAY
// also ends its connection, so the retry comes on a second one.
func TestH2CRefusalRetriedForPOST(t *testing.T) {
	for _, c := range []struct {
		action    rawtest.H2Action
		wantConns int64 // 0: not checked
	}{
		{rawtest.H2Refuse, 0},
		{rawtest.H2GoAwayBelow, 2},
		{rawtest.H2GoAwayBelowErr, 2},
	} {
		t.Run(fmt.Sprint(c.action), func(t *testing.T) {
			var executed atomic.Int64
			srv := rawtest.H2Server(t, func(i int64) rawtest.H2Action {
				if i == 1 {
					return c.action
				}
				return rawtest.H2Answer
			}, &executed)
			tr := h2cTransport(t)
			resp, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "transfer"))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			trc, _ := TraceOf(resp)
			if resp.StatusCode != 200 || string(b) != "ok" || resp.ProtoMajor != 2 {
				t.Fatalf("status %d proto %s body %q", resp.StatusCode, resp.Proto, b)
			}
			if executed.Load() != 1 || len(trc.Attempts) != 2 {
				t.Fatalf("executed %d attempts %d", executed.Load(), len(trc.Attempts))
			}
			if c.wantConns != 0 && srv.Conns() != c.wantConns {
				t.Fatalf("conns %d, want %d", srv.Conns(), c.wantConns)
			}
			a := trc.Attempts[0]
			if a.Failure != engine.RefusedStream || a.Evidence != engine.NotSent || a.Decision.Reason != engine.ReasonNotSent {
				t.Fatalf("first attempt %+v", a)
			}
		})
	}
}

func TestH2CGoAwayCoveringStreamIsAmbiguousForPOST(t *testing.T) {
	var executed atomic.Int64
	srv := rawtest.H2Server(t, func(i int64) rawtest.H2Action {
		if i == 1 {
			return rawtest.H2GoAwayCovers
		}
		return rawtest.H2Answer
	}, &executed)
	tr := h2cTransport(t)
	_, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "transfer"))
	var a *AmbiguousError
	if !errors.As(err, &a) {
		t.Fatalf("err %T %v, want ambiguous", err, err)
	}
	// The cause: the server's GOAWAY covered the stream and closed the
	// connection (a peer reset that refuses nothing).
	if !client.PeerReset(err) || client.StreamRefused(err) ||
		!strings.Contains(err.Error(), "server sent GOAWAY and closed the connection") || executed.Load() != 1 {
		t.Fatalf("cause %v executed %d", a.Err, executed.Load())
	}
}

func TestH2CRealServerKeepAlive(t *testing.T) {
	var hits atomic.Int64
	h2s := &http2.Server{}
	srv := rawtest.NewServer(t, func(c net.Conn, _ int) {
		h2s.ServeConn(c, &http2.ServeConnOpts{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hits.Add(1) == 1 {
				w.WriteHeader(503)
				return
			}
			io.WriteString(w, r.Proto)
		})})
	})
	tr := h2cTransport(t)
	for i := range 3 {
		resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL()))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "HTTP/2.0" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, b)
		}
	}
	if srv.Conns() != 1 || hits.Load() != 4 {
		t.Fatalf("conns %d hits %d, want 1 connection and 4 requests", srv.Conns(), hits.Load())
	}
}

// TestH2CResponseTimeoutAfterInterimResponse: over HTTP/2 too, an upstream
// that sends a 100 Continue and then stalls past the attempt timeout gave
// no final response header: response_timeout, ambiguous 504 for a POST.
// (net/http's HTTP/2 reports the cancelled attempt as context.Canceled, without
// the attempt timer's cause, once a first response byte has come.)
func TestH2CResponseTimeoutAfterInterimResponse(t *testing.T) {
	var executed atomic.Int64
	h2s := &http2.Server{}
	srv := rawtest.NewServer(t, func(c net.Conn, _ int) {
		h2s.ServeConn(c, &http2.ServeConnOpts{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			executed.Add(1)
			w.WriteHeader(http.StatusContinue) // sent at once; no Flush, which would send a 200
			<-r.Context().Done()
		})})
	})
	tr, _, _ := testTransport(t, func(p *Policy) { p.AttemptTimeout = 100 * time.Millisecond })
	base := client.NewHTTPTransport(client.HTTPOptions{H2C: true})
	t.Cleanup(base.CloseIdleConnections)
	tr.Base = base
	_, err := tr.RoundTrip(rawtest.Post(t, srv.URL(), "charge"))
	var a *AmbiguousError
	if !errors.As(err, &a) || a.Status != 504 || a.Attempts != 1 {
		t.Fatalf("err %v, want ambiguous 504 after 1 attempt", err)
	}
	if at := a.Trace.Attempts[0]; at.Failure != engine.ResponseTimeout {
		t.Fatalf("failure %v (%s), want response_timeout", at.Failure, at.Err)
	}
	if executed.Load() != 1 {
		t.Fatalf("executed %d", executed.Load())
	}
}

func tlsTransport(t *testing.T, srv *httptest.Server, h2 bool) *Transport {
	tr, _, _ := testTransport(t, nil)
	cfg := &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	base := client.NewHTTPTransport(client.HTTPOptions{TLS: cfg, HTTP2: h2})
	t.Cleanup(base.CloseIdleConnections)
	tr.Base = base
	return tr
}

func TestTLSALPN(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Proto) })
	for _, tc := range []struct {
		name      string
		serverH2  bool
		wantProto string
	}{{"h2", true, "HTTP/2.0"}, {"h1 fallback", false, "HTTP/1.1"}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(handler)
			srv.EnableHTTP2 = tc.serverH2
			srv.StartTLS()
			defer srv.Close()
			tr := tlsTransport(t, srv, true)
			for range 3 {
				resp, err := tr.RoundTrip(rawtest.Get(t, srv.URL))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != tc.wantProto || resp.TLS == nil {
					t.Fatalf("proto %q tls %v", b, resp.TLS != nil)
				}
			}
		})
	}
}

func TestTLSCertificateIsPermanentNotSent(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	tr, _, _ := testTransport(t, nil) // system roots: the test certificate is unknown
	_, err := tr.RoundTrip(rawtest.Post(t, srv.URL, "x"))
	var e *Error
	if !errors.As(err, &e) || e.Outcome != engine.OutcomeNotSent || e.Attempts != 1 {
		t.Fatalf("err %v", err)
	}
	if a := e.Trace.Attempts[0]; a.Failure != engine.TLSCertificate || a.Decision.Reason != engine.ReasonPermanentFailure || hits.Load() != 0 {
		t.Fatalf("attempt %+v hits %d", a, hits.Load())
	}
}

func TestTLSHandshakeFailureIsNotSent(t *testing.T) {
	// A server that answers the ClientHello with garbage.
	srv := rawtest.NewServer(t, func(c net.Conn, _ int) {
		buf := make([]byte, 512)
		c.Read(buf)
		io.WriteString(c, "HTTP/1.1 400 Bad Request\r\n\r\n")
	})
	tr, _, _ := testTransport(t, nil)
	_, err := tr.RoundTrip(rawtest.Post(t, "https://"+srv.Addr()+"/", "x"))
	var e *Error
	if !errors.As(err, &e) || e.Outcome != engine.OutcomeNotSent || e.Attempts != 3 {
		t.Fatalf("err %v", err)
	}
	if a := e.Trace.Attempts[0]; a.Failure != engine.TLSHandshake {
		t.Fatalf("attempt %+v", a)
	}
}

// h2BaseError sends one POST straight on client.HTTPTransport (h2c, no retry
// Transport) to a raw HTTP/2 server that does a to it, and returns
// RoundTrip's error: net/http's own, as egret's classifier receives it.
func h2BaseError(t *testing.T, a rawtest.H2Action) error {
	t.Helper()
	base := client.NewHTTPTransport(client.HTTPOptions{H2C: true})
	t.Cleanup(base.CloseIdleConnections)
	return rawtest.H2Error(t, base, a)
}

// h2PeerResetError is net/http's error for a stream the server reset with
// INTERNAL_ERROR after reading the whole request.
func h2PeerResetError(t *testing.T) error { return h2BaseError(t, rawtest.H2ResetAfterRead) }
