package kubenode

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// pki is the node's certificates, keys and tokens, written to dir.
type pki struct {
	dir    string
	caPEM  []byte
	tokens map[string]string // user file name -> bearer token
}

func (p *pki) file(name string) string { return filepath.Join(p.dir, name) }

// users are the token file's identities: file name, user, groups. The
// kubelet is a node (the Node authorizer and NodeRestriction hold it to
// its pods); the controller manager and scheduler run as masters, as the
// harness needs none of their own roles' detail; kube-proxy has its
// default role.
var users = []struct{ file, user, groups string }{
	{"admin", "egret-node-admin", "system:masters"},
	{"kubelet", "system:node:" + Name, "system:nodes"},
	{"controller-manager", "system:kube-controller-manager", "system:masters"},
	{"scheduler", "system:kube-scheduler", "system:masters"},
	// kube-proxy as clusters run it: the user the default
	// system:node-proxier binding names.
	{"kube-proxy", "system:kube-proxy", "system:node-proxiers"},
}

func makePKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "egret test node CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(48 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tokens: map[string]string{}}
	if err := os.WriteFile(p.file("ca.crt"), p.caPEM, 0o644); err != nil {
		return nil, err
	}
	leaf := func(name string, serial int64, tmpl *x509.Certificate) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(48*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := os.WriteFile(p.file(name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			return err
		}
		return os.WriteFile(p.file(name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	}
	// The apiserver as the node's processes reach it (127.0.0.1), as pods
	// reach it (the kubernetes Service's ClusterIP, DNAT to the node's
	// address) and by the Service's names.
	if err := leaf("apiserver", 2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP(IP), net.ParseIP(ServiceIP)},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}); err != nil {
		return nil, err
	}
	// The apiserver's client certificate for the kubelet's API (logs,
	// exec).
	if err := leaf("kubelet-client", 3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.file("sa.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.file("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}), 0o644); err != nil {
		return nil, err
	}
	var csv strings.Builder
	for _, u := range users {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		tok := hex.EncodeToString(b)
		p.tokens[u.file] = tok
		fmt.Fprintf(&csv, "%s,%s,%s-uid,%q\n", tok, u.user, u.user, u.groups)
	}
	if err := os.WriteFile(p.file("tokens.csv"), []byte(csv.String()), 0o600); err != nil {
		return nil, err
	}
	return p, nil
}
