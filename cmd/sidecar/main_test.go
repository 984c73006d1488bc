package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/sidecartest"
)

func dial(t *testing.T, addr string) (admissionv1.AdmissionServiceClient, healthpb.HealthClient) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return admissionv1.NewAdmissionServiceClient(conn), healthpb.NewHealthClient(conn)
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestEmbeddedDefaultServes(t *testing.T) {
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0"})
	client, health := dial(t, s.Addr)
	ctx := testContext(t)
	hc, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: admissionv1.AdmissionService_ServiceDesc.ServiceName})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v %v", hc, err)
	}
	p, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "demo"})
	if err != nil || p.GetGrant().GetSource() != "primary" {
		t.Fatalf("Pick on the demo scope: %v %v", p, err)
	}
	r, err := client.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "demo", CallId: p.CallId, PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
	if err != nil || r.GetDone() == nil {
		t.Fatalf("RecordOutcome: %v %v", r, err)
	}
	if err := s.Stop(t); err != nil {
		t.Fatalf("SIGTERM: exit %v, want a clean stop\n%s", err, s.Logs())
	}
}

func TestUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "polygate.sock")
	s := sidecartest.Start(t, []string{"--listen", "unix://" + sock})
	if s.Addr != "unix://"+sock {
		t.Fatalf("announced %q", s.Addr)
	}
	client, _ := dial(t, s.Addr)
	if _, err := client.ListScopes(testContext(t), &admissionv1.ListScopesRequest{}); err != nil {
		t.Fatal(err)
	}
}

func TestBadConfigurationStopsTheStart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(file, []byte("scopes: {chat: {breaker: {fail_rate: 1.5}, sources: [{name: a}]}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sidecartest.Binary(t), "--config", file).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "scopes.chat.breaker.fail_rate: 1.5 is not allowed; must be in (0, 1]") {
		t.Fatalf("exit %v, output %s", err, out)
	}
	out, err = exec.Command(sidecartest.Binary(t), "--check", "--config", file).CombinedOutput()
	if err == nil {
		t.Fatalf("--check accepted a bad file: %s", out)
	}
	out, err = exec.Command(sidecartest.Binary(t), "--check", "--output", "json").Output()
	if err != nil || !json.Valid(out) || !regexp.MustCompile(`"probe_ttl":\s+"1m"`).Match(out) {
		t.Fatalf("--check of the demo: %v %s", err, out)
	}
}

const reloadConfig = `
scopes:
  chat:
    breaker: {fail_threshold: 1, cooldown: 1h, max_cooldown: 1h}
    sources: [{name: only, max_concurrency: MAX}]
`

func TestReloadKeepsStateAndRejectsABadFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	write := func(body string) {
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(strings.Replace(reloadConfig, "MAX", "1", 1))
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	client, _ := dial(t, s.Addr)
	ctx := testContext(t)
	p, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.CallId, PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT}); err != nil {
		t.Fatal(err)
	}

	write(strings.Replace(reloadConfig, "MAX", "3", 1))
	s.Signal(t, syscall.SIGHUP)
	s.WaitLog(t, ctx, "configuration reloaded")
	d, err := client.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	if src := d.Scope.Sources[0]; src.Config.MaxConcurrency != 3 || src.State != admissionv1.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("after reload: %v, want max_concurrency 3 and the breaker still open", src)
	}

	write("scopes: {chat: {max_attempts: 0, sources: [{name: only}]}}\n")
	s.Signal(t, syscall.SIGHUP)
	s.WaitLog(t, ctx, "configuration reload rejected")
	if !strings.Contains(s.Logs(), "scopes.chat.max_attempts: 0 is not allowed") {
		t.Fatalf("the rejection does not say why:\n%s", s.Logs())
	}
	d, err = client.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: "chat"})
	if err != nil || d.Scope.Config.MaxAttempts != 3 || d.Scope.Sources[0].Config.MaxConcurrency != 3 {
		t.Fatalf("after a bad reload: %v %v, want the running configuration", d, err)
	}
}

// A graceful stop answers callers that wait inside the sidecar at once, with
// the rest of their sleep, instead of cutting them off.
func TestGracefulStopAnswersWaiters(t *testing.T) {
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	if err := os.WriteFile(file, []byte(`
log: {level: debug} # the per-call "call waiting" line
scopes:
  chat:
    circuit_open: wait
    breaker: {fail_threshold: 1, cooldown: 1h, max_cooldown: 1h}
    sources: [{name: only}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	client, _ := dial(t, s.Addr)
	ctx := testContext(t)
	p, _ := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
	if _, err := client.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.CallId, PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT}); err != nil {
		t.Fatal(err)
	}
	w, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
	if err != nil || w.GetNoRunnable() == nil {
		t.Fatalf("%v %v", w, err)
	}
	answer := make(chan *admissionv1.OnNoRunnableResponse, 1)
	go func() {
		d, err := client.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: w.CallId})
		if err != nil {
			t.Errorf("OnNoRunnable during a stop: %v", err)
		}
		answer <- d
	}()
	s.WaitLog(t, ctx, "call waiting")
	if err := s.Stop(t); err != nil {
		t.Fatalf("stop: %v", err)
	}
	d := <-answer
	// The hour-long cooldown is clamped to the stall budget (300s + one poll
	// interval); the waiter gets back almost all of that to sleep itself.
	if wait := d.GetWait(); wait == nil || wait.Sleep.AsDuration() < 299*time.Second || wait.Sleep.AsDuration() > 300*time.Second+50*time.Millisecond {
		t.Fatalf("waiter got %v, want a Wait with the rest of its sleep", d)
	}
}

func TestMain(m *testing.M) { sidecartest.Main(m) }

func TestReloadRotatesTheToken(t *testing.T) {
	file := filepath.Join(t.TempDir(), "polygate.yaml")
	write := func(token string) {
		body := "auth: {token: " + token + "}\nscopes: {chat: {sources: [{name: only}]}}\n"
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("old-token-0123456789")
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", file})
	client, _ := dial(t, s.Addr)
	ctx := testContext(t)
	with := func(token string) error {
		_, err := client.ListScopes(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), &admissionv1.ListScopesRequest{})
		return err
	}
	if err := with("old-token-0123456789"); err != nil {
		t.Fatal(err)
	}
	write("new-token-9876543210")
	s.Signal(t, syscall.SIGHUP)
	s.WaitLog(t, ctx, "configuration reloaded")
	if err := with("old-token-0123456789"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the rotated-out token: %v, want UNAUTHENTICATED", err)
	}
	if err := with("new-token-9876543210"); err != nil {
		t.Fatalf("the new token: %v", err)
	}
}
