package polygate_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	polygate "github.com/polygate/polygate/clientsdk/go"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// fakeSidecar answers every Pick with a circuit_open failure after checking
// the bearer token; it is enough to see what reaches the server.
type fakeSidecar struct {
	admissionv1.UnimplementedAdmissionServiceServer
	token string
}

func (f *fakeSidecar) Pick(ctx context.Context, _ *admissionv1.PickRequest) (*admissionv1.PickResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+f.token {
		return nil, status.Errorf(codes.Unauthenticated, "authorization %q", got)
	}
	return &admissionv1.PickResponse{CallId: "c1", Result: &admissionv1.PickResponse_Failure{
		Failure: &admissionv1.Failure{Reason: admissionv1.FailureReason_FAILURE_REASON_CIRCUIT_OPEN},
	}}, nil
}

// tlsSidecar serves fakeSidecar over TLS with a fresh self-signed
// certificate for 127.0.0.1, and returns its address and the certificate's
// PEM file.
func tlsSidecar(t *testing.T, token string) (addr, caFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "polygate test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	srv := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(&cert)))
	admissionv1.RegisterAdmissionServiceServer(srv, &fakeSidecar{token: token})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), caFile
}

func never(context.Context, polygate.Attempt) (int, polygate.Result) {
	panic("no attempt may run: the fake sidecar never grants")
}

func TestDial_TLSAndToken(t *testing.T) {
	addr, caFile := tlsSidecar(t, "s3cret")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(caFile)
	pool.AppendCertsFromPEM(ca)
	empty := x509.NewCertPool() // WithTLSCAFile adds to a copy: it stays empty

	tests := []struct {
		name string
		opts []polygate.Option
		want error // a sentinel errors.Is matches
	}{
		{"CA file and token", []polygate.Option{polygate.WithTLSCAFile(caFile), polygate.WithToken("s3cret")}, polygate.ErrCircuitOpen},
		{"tls.Config and token", []polygate.Option{polygate.WithTLS(&tls.Config{RootCAs: pool}), polygate.WithToken("s3cret")}, polygate.ErrCircuitOpen},
		{"tls.Config and CA file", []polygate.Option{polygate.WithTLS(&tls.Config{RootCAs: empty}), polygate.WithTLSCAFile(caFile), polygate.WithToken("s3cret")}, polygate.ErrCircuitOpen},
		{"wrong token", []polygate.Option{polygate.WithTLSCAFile(caFile), polygate.WithToken("wrong")}, polygate.ErrUnauthenticated},
		{"plaintext to a TLS sidecar", []polygate.Option{polygate.WithToken("s3cret")}, polygate.ErrUnavailable},
		{"untrusted certificate", []polygate.Option{polygate.WithTLS(&tls.Config{RootCAs: empty}), polygate.WithToken("s3cret")}, polygate.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := polygate.Dial(addr, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := polygate.Do(ctx, c, "chat", never); !errors.Is(err, tt.want) {
				t.Errorf("Do = %v; want %v", err, tt.want)
			}
		})
	}
}

func TestDial_BadCAFileNamesIt(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{filepath.Join(t.TempDir(), "missing.pem"), notPEM} {
		if _, err := polygate.Dial("127.0.0.1:1", polygate.WithTLSCAFile(file)); err == nil || !strings.Contains(err.Error(), file) {
			t.Errorf("Dial with CA file %s = %v; want an error naming it", file, err)
		}
	}
}
