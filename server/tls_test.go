package server

import (
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
