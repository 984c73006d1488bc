package e2e

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/sidecartest"
	"github.com/polygate/polygate/internal/testcerts"
)

const hostileScopes = `
scopes:
  chat:
    sources: [{name: a, timeout: 30s}, {name: b, timeout: 30s}]
`

// startWith writes config and starts the real binary with env.
func startWith(t *testing.T, config string, env ...string) *sidecartest.Sidecar {
	t.Helper()
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := sidecartest.Start(t, []string{"--config", file, "--listen", "127.0.0.1:0"}, env...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sidecar logs:\n%s", sc.Logs())
		}
	})
	return sc
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) admissionv1.AdmissionServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return admissionv1.NewAdmissionServiceClient(conn)
}

// TestTLS_RefusesPlaintextAndClientsWithoutCertificates: with tls.cert_file
// the sidecar speaks TLS only; with tls.client_ca_file a client must present
// a certificate the CA signed.
func TestTLS_RefusesPlaintextAndClientsWithoutCertificates(t *testing.T) {
	ca := testcerts.NewCA(t)
	server, client := ca.Issue("polygate"), ca.Issue("app")
	other := testcerts.NewCA(t).Issue("stranger") // signed by another CA
	list := func(c admissionv1.AdmissionServiceClient) error {
		_, err := c.ListScopes(ctxT(t), &admissionv1.ListScopesRequest{})
		return err
	}
	tlsTo := func(certs ...tls.Certificate) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, Certificates: certs, MinVersion: tls.VersionTLS12})
	}

	t.Run("tls", func(t *testing.T) {
		sc := startWith(t, "tls: {cert_file: "+server.CertFile+", key_file: "+server.KeyFile+"}\n"+hostileScopes)
		if err := list(dial(t, sc.Addr, insecure.NewCredentials())); status.Code(err) != codes.Unavailable {
			t.Fatalf("plaintext client: %v, want UNAVAILABLE (refused)", err)
		}
		if err := list(dial(t, sc.Addr, tlsTo())); err != nil {
			t.Fatalf("TLS client: %v", err)
		}
	})
	t.Run("mtls", func(t *testing.T) {
		sc := startWith(t, "tls: {cert_file: "+server.CertFile+", key_file: "+server.KeyFile+", client_ca_file: "+ca.File+"}\n"+hostileScopes)
		if err := list(dial(t, sc.Addr, insecure.NewCredentials())); status.Code(err) != codes.Unavailable {
			t.Fatalf("plaintext client: %v, want UNAVAILABLE (refused)", err)
		}
		if err := list(dial(t, sc.Addr, tlsTo())); status.Code(err) != codes.Unavailable {
			t.Fatalf("TLS client without a certificate: %v, want UNAVAILABLE (refused)", err)
		}
		if err := list(dial(t, sc.Addr, tlsTo(other.TLS))); status.Code(err) != codes.Unavailable {
			t.Fatalf("client certificate of another CA: %v, want UNAVAILABLE (refused)", err)
		}
		if err := list(dial(t, sc.Addr, tlsTo(client.TLS))); err != nil {
			t.Fatalf("client with a certificate: %v", err)
		}
	})
}

// TestRoles_OperatorTokenFromFile: with auth.operator_token_file the
// application's token cannot override a breaker or watch events; the
// operator's can, and a rotated operator token applies after SIGHUP.
func TestRoles_OperatorTokenFromFile(t *testing.T) {
	dir := t.TempDir()
	opFile := filepath.Join(dir, "operator")
	if err := os.WriteFile(opFile, []byte("op-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := startWith(t, "auth: {operator_token_file: "+opFile+"}\n"+hostileScopes, "POLYGATE_AUTH__TOKEN=app")
	c := dial(t, sc.Addr, insecure.NewCredentials())
	as := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer "+token)
	}
	override := func(token string) error {
		_, err := c.OverrideBreaker(as(token), &admissionv1.OverrideBreakerRequest{Scope: "chat", Source: "a",
			Action: admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, Actor: "e2e", Reason: "roles"})
		return err
	}
	watch := func(token string) error {
		ctx, cancel := context.WithCancel(as(token))
		defer cancel()
		s, err := c.WatchEvents(ctx, &admissionv1.WatchEventsRequest{})
		if err != nil {
			return err
		}
		md, err := s.Header()
		if err == nil && md == nil {
			_, err = s.Recv()
		}
		return err
	}
	for name, call := range map[string]func(string) error{"override": override, "watch": watch} {
		if err := call("app"); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("%s with the application's token: %v, want PERMISSION_DENIED", name, err)
		}
		if err := call("op-1"); err != nil {
			t.Fatalf("%s with the operator's token: %v", name, err)
		}
	}
	if _, err := c.Pick(as("app"), &admissionv1.PickRequest{Scope: "chat"}); err != nil {
		t.Fatalf("Pick with the application's token: %v", err)
	}

	if err := os.WriteFile(opFile, []byte("op-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sc.Signal(t, syscall.SIGHUP)
	eventually(t, "the rotated operator token applies", func() bool { return override("op-2") == nil })
	if err := override("op-1"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the old operator token after rotation: %v, want UNAUTHENTICATED", err)
	}
	if !strings.Contains(sc.Logs(), "configuration reloaded") {
		t.Fatal("no reload in the log")
	}
}

// TestHostileInputs_RealBinary: the issue's hostile inputs against the real
// binary get bounded answers: the RetryAfter amplifier, an overlong name, a
// token count that would wrap TPM, a century-long hint, and 500 watchers.
func TestHostileInputs_RealBinary(t *testing.T) {
	sc := startWith(t, hostileScopes)
	c := dial(t, sc.Addr, insecure.NewCredentials())
	ctx := ctxT(t)
	dup := make([]string, 20000)
	for i := range dup {
		dup[i] = "a"
	}
	if _, err := c.RetryAfter(ctx, &admissionv1.RetryAfterRequest{Scope: "chat", Sources: dup}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("RetryAfter with 20000 copies of one source: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := c.RetryAfter(ctx, &admissionv1.RetryAfterRequest{Scope: "chat", Sources: append(dup, dup...)}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 120 KB request: %v, want RESOURCE_EXHAUSTED", err)
	}
	long := strings.Repeat("x", 60000)
	_, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: long})
	if status.Code(err) != codes.InvalidArgument || len(status.Convert(err).Message()) > 300 {
		t.Fatalf("a 60 KB scope: %v, want a short INVALID_ARGUMENT", status.Convert(err).Code())
	}
	p, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	huge := int64(1<<63 - 1)
	if _, err := c.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.GetCallId(), PermitId: p.GetGrant().GetPermitId(),
		Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, ActualTokens: &huge}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("actual_tokens MaxInt64: %v, want INVALID_ARGUMENT", err)
	}
	r, err := c.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.GetCallId(), PermitId: p.GetGrant().GetPermitId(),
		Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT, RetryAfterHint: durationpb.New(100 * 365 * 24 * time.Hour)})
	if err != nil || r.GetFailure().GetReason() != admissionv1.FailureReason_FAILURE_REASON_RETRY_AFTER_TOO_LONG {
		t.Fatalf("a century-long TRANSIENT hint: %v %v, want Failure(retry_after_too_long)", r, err)
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	open, refused := 0, 0
	for range 500 {
		s, err := c.WatchEvents(wctx, &admissionv1.WatchEventsRequest{})
		if err == nil {
			var md metadata.MD
			if md, err = s.Header(); err == nil && md == nil {
				_, err = s.Recv()
			}
		}
		switch status.Code(err) {
		case codes.OK:
			open++
		case codes.ResourceExhausted:
			refused++
		default:
			t.Fatalf("watch: %v", err)
		}
	}
	if open != 64 || refused != 436 {
		t.Fatalf("500 watchers: %d open, %d refused; want 64 (events.max_watchers) and 436", open, refused)
	}
}
