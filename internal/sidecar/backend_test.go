package sidecar

import (
	"crypto/tls"
	"testing"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/internal/testcerts"
)

// TestRedisTLS: the Redis keys make the client's TLS configuration,
// which verifies the server by the CA and the name, and presents the client
// certificate.
func TestRedisTLS(t *testing.T) {
	ca := testcerts.NewCA(t)
	srv, cli := ca.Issue("redis.internal"), ca.Issue("client")
	c, err := redisTLS(config.Redis{TLS: true, TLSCAFile: ca.File, TLSCertFile: cli.CertFile, TLSKeyFile: cli.KeyFile, TLSServerName: "redis.internal"})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{srv.TLS}, ClientCAs: ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan error, 1)
	go func() {
		conn, err := lis.Accept()
		if err == nil {
			err = conn.(*tls.Conn).Handshake()
			conn.Close()
		}
		done <- err
	}()
	conn, err := tls.Dial("tcp", lis.Addr().String(), c)
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	conn.Close()
	if err := <-done; err != nil {
		t.Fatalf("server side: %v", err)
	}
	if off, err := redisTLS(config.Redis{}); off != nil || err != nil {
		t.Fatalf("tls off: %v %v", off, err)
	}
}
