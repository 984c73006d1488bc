package server

import (
	"crypto/tls"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/internal/testcerts"
)

// TestTLSRotation: a certificate rewritten in place is served at the next
// handshake after the files are looked at again, without a restart; a
// rewrite that does not load keeps the previous certificate.
func TestTLSRotation(t *testing.T) {
	ca := testcerts.NewCA(t)
	one := ca.Issue("one")
	clock := gatetest.NewClock()
	tc, err := newCertFiles(config.TLS{CertFile: one.CertFile, KeyFile: one.KeyFile}, slog.New(slog.NewTextHandler(io.Discard, nil)), clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	served := func() string {
		t.Helper()
		c, err := tc.GetConfigForClient(nil)
		if err != nil {
			t.Fatal(err)
		}
		leaf := c.Certificates[0].Leaf
		return leaf.Subject.CommonName
	}
	if got := served(); got != "one" {
		t.Fatalf("serves %q", got)
	}
	two := ca.Issue("two")
	replace := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(time.Hour) // a new modification time, whatever the file system's resolution
		if err := os.Chtimes(to, later, later); err != nil {
			t.Fatal(err)
		}
	}
	replace(two.CertFile, one.CertFile)
	replace(two.KeyFile, one.KeyFile)
	clock.Advance(statInterval)
	if got := served(); got != "two" {
		t.Fatalf("after rotation serves %q, want two", got)
	}
	if err := os.WriteFile(one.CertFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	clock.Advance(statInterval)
	if got := served(); got != "two" {
		t.Fatalf("after a broken rotation serves %q, want the previous two", got)
	}
}

// TestListenUnixMode: listen_mode sets the socket's permission bits.
func TestListenUnixMode(t *testing.T) {
	path := t.TempDir() + "/p.sock"
	lis, err := ListenUnix(path, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 {
		t.Fatalf("mode %v, want 0660", fi.Mode().Perm())
	}
}

// TestRedisTLSConfig: the Redis keys make the client's TLS configuration,
// which verifies the server by the CA and the name, and presents the client
// certificate.
func TestRedisTLSConfig(t *testing.T) {
	ca := testcerts.NewCA(t)
	srv, cli := ca.Issue("redis.internal"), ca.Issue("client")
	c, err := RedisTLSConfig(config.Redis{TLS: true, TLSCAFile: ca.File, TLSCertFile: cli.CertFile, TLSKeyFile: cli.KeyFile, TLSServerName: "redis.internal"})
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
	if off, err := RedisTLSConfig(config.Redis{}); off != nil || err != nil {
		t.Fatalf("tls off: %v %v", off, err)
	}
}
