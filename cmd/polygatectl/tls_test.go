package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// The sidecar does not serve TLS yet (planned); these tests check the
// client side against a gRPC server that does, answering ListScopes.

type listOnly struct {
	admissionv1.UnimplementedAdmissionServiceServer
}

func (listOnly) ListScopes(context.Context, *admissionv1.ListScopesRequest) (*admissionv1.ListScopesResponse, error) {
	return &admissionv1.ListScopesResponse{Scopes: []*admissionv1.ScopeDescription{{
		Config: &admissionv1.ScopeConfig{Name: "tls-scope"}, Backend: "memory",
	}}}, nil
}

type pki struct {
	dir                string
	ca                 *x509.Certificate
	caKey              *ecdsa.PrivateKey
	server             tls.Certificate
	caFile, otherCA    string
	clientCrt, clientK string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	p.ca, p.caKey, p.caFile = p.authority(t, "ca")
	_, _, p.otherCA = p.authority(t, "other-ca")
	p.server = p.leaf(t, "server", x509.ExtKeyUsageServerAuth, "polygate.test")
	client := p.leaf(t, "client", x509.ExtKeyUsageClientAuth, "")
	p.clientCrt, p.clientK = filepath.Join(p.dir, "client.pem"), filepath.Join(p.dir, "client-key.pem")
	writePEM(t, p.clientCrt, "CERTIFICATE", client.Certificate[0])
	der, err := x509.MarshalECPrivateKey(client.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, p.clientK, "EC PRIVATE KEY", der)
	return p
}

func (p *pki) authority(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(p.dir, name+".pem")
	writePEM(t, file, "CERTIFICATE", der)
	return cert, key, file
}

func (p *pki) leaf(t *testing.T, name string, usage x509.ExtKeyUsage, dns string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature}
	if dns != "" {
		tmpl.DNSNames = []string{dns}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEM(t *testing.T, file, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// serveTLS starts a gRPC server with the PKI's server certificate; with
// mutual, it requires a client certificate signed by the CA.
func serveTLS(t *testing.T, p *pki, mutual bool) string {
	t.Helper()
	cfg := &tls.Config{Certificates: []tls.Certificate{p.server}, MinVersion: tls.VersionTLS12}
	if mutual {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = x509.NewCertPool()
		cfg.ClientCAs.AddCert(p.ca)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	admissionv1.RegisterAdmissionServiceServer(srv, listOnly{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func TestTLSOptions(t *testing.T) {
	p := newPKI(t)
	tlsAddr, mtlsAddr := serveTLS(t, p, false), serveTLS(t, p, true)
	for _, tc := range []struct {
		name string
		args []string
		want string // in the output, or in the error when fail
		fail bool
	}{
		{"private CA", []string{"--addr", tlsAddr, "--ca-file", p.caFile, "--server-name", "polygate.test"}, "tls-scope", false},
		{"--tls with the CA", []string{"--addr", tlsAddr, "--tls", "--ca-file", p.caFile, "--server-name", "polygate.test"}, "tls-scope", false},
		{"wrong CA", []string{"--addr", tlsAddr, "--ca-file", p.otherCA, "--server-name", "polygate.test"}, "UNAVAILABLE", true},
		{"wrong name", []string{"--addr", tlsAddr, "--ca-file", p.caFile, "--server-name", "other.test"}, "UNAVAILABLE", true},
		{"plaintext to a TLS server", []string{"--addr", tlsAddr, "--timeout", "2s"}, "", true},
		{"mTLS with a client certificate", []string{"--addr", mtlsAddr, "--ca-file", p.caFile, "--server-name", "polygate.test",
			"--cert-file", p.clientCrt, "--key-file", p.clientK}, "tls-scope", false},
		{"mTLS without one", []string{"--addr", mtlsAddr, "--ca-file", p.caFile, "--server-name", "polygate.test"}, "UNAVAILABLE", true},
		{"a CA file without a certificate", []string{"--addr", tlsAddr, "--ca-file", p.clientK}, "no PEM certificate", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			var out, errOut syncBuffer
			err := run(ctx, append(tc.args, "scopes"), env(), &out, &errOut)
			switch {
			case tc.fail && err == nil:
				t.Fatalf("no error; stdout:\n%s", out.String())
			case tc.fail && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q lacks %q", err, tc.want)
			case !tc.fail && err != nil:
				t.Fatal(err)
			case !tc.fail && !strings.Contains(out.String(), tc.want):
				t.Fatalf("stdout lacks %q:\n%s", tc.want, out.String())
			}
		})
	}
}
