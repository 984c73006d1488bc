package kit

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

	"google.golang.org/grpc/credentials"
)

// TLSFiles are the PEM texts a runner gives its SDK for an exchange served
// over TLS: the CA that signed the fake sidecar's certificate (for
// localhost and 127.0.0.1) and, for mTLS, a client certificate and key.
type TLSFiles struct {
	CA         string `json:"ca"`
	ClientCert string `json:"client_cert,omitempty"`
	ClientKey  string `json:"client_key,omitempty"`
}

// serverTLS makes a throwaway CA, the fake sidecar's certificate and, for
// mTLS, a client certificate, and the server's credentials (requiring a
// client certificate of the CA when mtls).
func serverTLS(mtls bool) (credentials.TransportCredentials, *TLSFiles, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "polygate conformance CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, err
	}
	issue := func(serial int64, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte, err error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		kder, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
	}
	serverCert, serverKey, err := issue(2, "polygate conformance sidecar", x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, nil, err
	}
	pair, err := tls.X509KeyPair(serverCert, serverKey)
	if err != nil {
		return nil, nil, err
	}
	files := &TLSFiles{CA: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if mtls {
		clientCert, clientKey, err := issue(3, "polygate conformance app", x509.ExtKeyUsageClientAuth)
		if err != nil {
			return nil, nil, err
		}
		files.ClientCert, files.ClientKey = string(clientCert), string(clientKey)
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = x509.NewCertPool()
		cfg.ClientCAs.AddCert(ca)
	}
	return credentials.NewTLS(cfg), files, nil
}
