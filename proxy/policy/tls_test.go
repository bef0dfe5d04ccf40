package policy

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// tlsUpstream starts an HTTPS server with the test PKI's server
// certificate; with mutual it requires a client certificate from the CA.
// The handler answers with the client certificate's subject.
func tlsUpstream(t *testing.T, keys *pki, mutual bool) *httptest.Server {
	t.Helper()
	pair, err := tls.X509KeyPair(keys.serverCertPEM, keys.serverKeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cn := "none"
		if len(r.TLS.PeerCertificates) > 0 {
			cn = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		fmt.Fprint(w, cn)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	if mutual {
		srv.TLS.ClientAuth = tls.RequireAndVerifyClientCert
		srv.TLS.ClientCAs = keys.caPool
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, cfg *tls.Config, url string) (string, error) {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: false}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// The TLS configuration built from real files completes a real mutual TLS
// handshake: the CA file verifies the server, the client pair is presented.
func TestTLSConfigHandshake(t *testing.T) {
	dir := t.TempDir()
	keys := newPKI(t, dir)
	srv := tlsUpstream(t, keys, true)
	path := writeFile(t, dir, "p.yaml", `upstreams:
  - host: upstream.test
    protocol: http1
    tls:
      enabled: true
      server_name: upstream.test
      ca_file: ca.pem
      cert_file: client.pem
      key_file: client-key.pem
  - host: noclient.test
    tls: {enabled: true, server_name: upstream.test, ca_file: ca.pem}
  - host: noca.test
    tls: {enabled: true, server_name: upstream.test}
  - host: insecure.test
    tls: {enabled: true, insecure_skip_verify: true, cert_file: client.pem, key_file: client-key.pem}
`)
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "insecure_skip_verify") {
		t.Errorf("warnings %q", p.Warnings)
	}
	u := p.Match("upstream.test", 443)
	cfg := u.TLSConfig()
	if cfg == nil || !reflect.DeepEqual(cfg.NextProtos, []string{"http/1.1"}) || cfg.MinVersion != tls.VersionTLS12 {
		t.Fatalf("config %+v", cfg)
	}
	body, err := get(t, cfg, srv.URL)
	if err != nil || body != keys.clientSubject {
		t.Errorf("mutual TLS: %q %v", body, err)
	}
	// Each call gives a copy: changing one does not change the policy.
	cfg.ServerName = "elsewhere.test"
	if u.TLSConfig().ServerName != "upstream.test" {
		t.Error("TLSConfig returned the shared configuration")
	}

	// Without the client pair the server refuses the handshake.
	if _, err := get(t, p.Match("noclient.test", 443).TLSConfig(), srv.URL); err == nil {
		t.Error("handshake without a client certificate succeeded")
	}
	// Without the CA the server's certificate is not trusted.
	noCA := p.Match("noca.test", 443).TLSConfig()
	if _, err := get(t, noCA, srv.URL); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("handshake without the CA: %v", err)
	}
	if !reflect.DeepEqual(noCA.NextProtos, []string{"h2", "http/1.1"}) {
		t.Errorf("auto protocol offers %q", noCA.NextProtos)
	}
	// insecure_skip_verify trusts anything (and still presents the pair).
	body, err = get(t, p.Match("insecure.test", 443).TLSConfig(), srv.URL)
	if err != nil || body != keys.clientSubject {
		t.Errorf("insecure: %q %v", body, err)
	}
}

// TLSConfigID follows the content the configuration was built from: equal
// for upstreams that speak TLS alike, new when a file it read changed.
func TestTLSConfigIDFollowsFiles(t *testing.T) {
	dir := t.TempDir()
	newPKI(t, dir)
	path := writeFile(t, dir, "p.yaml", `upstreams:
  - host: a.test
    tls: {enabled: true, server_name: upstream.test, ca_file: ca.pem, cert_file: client.pem, key_file: client-key.pem}
  - host: b.test
    tls: {enabled: true, server_name: upstream.test, ca_file: ca.pem, cert_file: client.pem, key_file: client-key.pem}
  - host: c.test
    tls: {enabled: true, server_name: other.test, ca_file: ca.pem, cert_file: client.pem, key_file: client-key.pem}
  - host: plain.test
`)
	ids := func() (a, b, c, plain string) {
		t.Helper()
		p, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		return p.Match("a.test", 443).TLSConfigID(), p.Match("b.test", 443).TLSConfigID(),
			p.Match("c.test", 443).TLSConfigID(), p.Match("plain.test", 80).TLSConfigID()
	}
	a, b, c, plain := ids()
	if a == "" || a != b || a == c || plain != "" {
		t.Fatalf("ids a %q b %q c %q plain %q: want a == b, c different, plain empty", a, b, c, plain)
	}
	if again, _, _, _ := ids(); again != a {
		t.Errorf("the same files read again: id %q, was %q", again, a)
	}
	newPKI(t, dir) // new CA and client pair under the same names
	if rotated, _, _, _ := ids(); rotated == a {
		t.Error("id unchanged after the CA and client files were rewritten")
	}
}
