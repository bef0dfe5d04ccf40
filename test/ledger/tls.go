package ledger

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"time"
)

// testCA is a CA made for one server, and the leaf it signed.
type testCA struct {
	pem  []byte
	pool *x509.CertPool
	leaf tls.Certificate
}

func (s *Server) testCA() (*testCA, error) {
	s.caOnce.Do(func() { s.ca, s.caErr = newTestCA() })
	return s.ca, s.caErr
}

// CAPEM returns the PEM of the CA that signed the TLS listener's
// certificate (generated on first use).
func (s *Server) CAPEM() ([]byte, error) {
	ca, err := s.testCA()
	if err != nil {
		return nil, err
	}
	return ca.pem, nil
}

// ClientTLSConfig returns a client configuration that trusts the test CA and
// offers ALPN protos (e.g. "h2", "http/1.1").
func (s *Server) ClientTLSConfig(protos ...string) (*tls.Config, error) {
	ca, err := s.testCA()
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: ca.pool, NextProtos: protos, MinVersion: tls.VersionTLS12}, nil
}

func (ca *testCA) serverConfig() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{ca.leaf},
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
	}
}

func newTestCA() (*testCA, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "egret ledger test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "ledger"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return &testCA{
		pem:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pool: pool,
		leaf: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: nil},
	}, nil
}
