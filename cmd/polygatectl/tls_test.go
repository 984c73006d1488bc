package main

import (
	"strings"
	"testing"

	"github.com/polygate/polygate/internal/admissiontest"
	"github.com/polygate/polygate/internal/testcerts"
)

// TestTLSOptions runs polygatectl's TLS options against the real sidecar
// serving TLS, and mutual TLS, with certificates made by the test.
func TestTLSOptions(t *testing.T) {
	ca := testcerts.NewCA(t)
	server, client := ca.Issue("polygate.test"), ca.Issue("operator")
	otherCA := testcerts.NewCA(t)
	tlsSidecar := startSidecarWith(t, "127.0.0.1:0", "tls: {cert_file: "+server.CertFile+", key_file: "+server.KeyFile+"}\n")
	mtlsSidecar := startSidecarWith(t, "127.0.0.1:0",
		"tls: {cert_file: "+server.CertFile+", key_file: "+server.KeyFile+", client_ca_file: "+ca.File+"}\n")
	tlsAddr, mtlsAddr := tlsSidecar.Addr, mtlsSidecar.Addr
	for _, tc := range []struct {
		name string
		args []string
		want string // in the output, or in the error when fail
		fail bool
	}{
		{"private CA", []string{"--addr", tlsAddr, "--ca-file", ca.File, "--server-name", "polygate.test"}, "chat", false},
		{"--tls with the CA", []string{"--addr", tlsAddr, "--tls", "--ca-file", ca.File, "--server-name", "polygate.test"}, "chat", false},
		{"wrong CA", []string{"--addr", tlsAddr, "--ca-file", otherCA.File, "--server-name", "polygate.test"}, "UNAVAILABLE", true},
		{"wrong name", []string{"--addr", tlsAddr, "--ca-file", ca.File, "--server-name", "other.test"}, "UNAVAILABLE", true},
		{"plaintext to a TLS server", []string{"--addr", tlsAddr, "--timeout", "2s"}, "", true},
		{"mTLS with a client certificate", []string{"--addr", mtlsAddr, "--ca-file", ca.File, "--server-name", "polygate.test",
			"--cert-file", client.CertFile, "--key-file", client.KeyFile}, "chat", false},
		{"mTLS without one", []string{"--addr", mtlsAddr, "--ca-file", ca.File, "--server-name", "polygate.test"}, "UNAVAILABLE", true},
		{"a CA file without a certificate", []string{"--addr", tlsAddr, "--ca-file", client.KeyFile}, "no PEM certificate", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			var out, errOut admissiontest.LockedBuffer
			err := run(ctx, append(tc.args, "scopes"), env("POLYGATE_TOKEN="+token), &out, &errOut)
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
