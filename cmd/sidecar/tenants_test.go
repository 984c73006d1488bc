package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/testcerts"
)

// Tenants as principals over the wire, on the real binary: a credential
// names the tenant, each tenant's limits and ceiling hold, and configured
// weights survive any number of one-off tenants, on each backend.

// asToken is ctx carrying a bearer token.
func asToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// wantTenantError checks an error's code, ErrorInfo reason and metadata.
func wantTenantError(t *testing.T, err error, code codes.Code, reason admissionv1.ErrorReason, meta map[string]string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code {
		t.Fatalf("error %v, want %v", err, code)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == reason.String() {
			for k, v := range meta {
				if info.GetMetadata()[k] != v {
					t.Fatalf("metadata %v, want %s=%s", info.GetMetadata(), k, v)
				}
			}
			return
		}
	}
	t.Fatalf("error %v has no ErrorInfo %v", err, reason)
}

// tenants reads the scope's tenants from DescribeScope, by name.
func tenants(t *testing.T, ctx context.Context, c admissionv1.AdmissionServiceClient, scope string) map[string]*admissionv1.TenantState {
	t.Helper()
	d, err := c.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*admissionv1.TenantState{}
	for _, ts := range d.GetScope().GetTenants() {
		out[ts.GetName()] = ts
	}
	return out
}

// TestTenantTokenSetsTheTenant: a call authenticated with a tenant token is
// that tenant's: a Pick without a tenant takes it, one naming another
// tenant is PERMISSION_DENIED naming both.
func TestTenantTokenSetsTheTenant(t *testing.T) { eachBackend(t, testTenantTokenSetsTheTenant) }

func testTenantTokenSetsTheTenant(t *testing.T, be orderBackend) {
	_, client := startScope(t, `  chat:
    tenants: {team-a: 1, team-b: 1}
    sources: [{name: only}]
`, be.config(t), "auth:\n  token: app-token\n  tenant_tokens: [{tenant: team-a, token: a-token}, {tenant: team-b, token: b-token}]")
	ctx := testContext(t)
	p, err := client.Pick(asToken(ctx, "a-token"), &admissionv1.PickRequest{Scope: "chat"})
	if err != nil || p.GetGrant() == nil {
		t.Fatalf("Pick with team-a's token: %v %v", p, err)
	}
	ts := tenants(t, asToken(ctx, "app-token"), client, "chat")
	if ts["team-a"].GetLiveCalls() != 1 || ts["team-b"].GetLiveCalls() != 0 || ts["~other"].GetLiveCalls() != 0 {
		t.Fatalf("live calls team-a %d, team-b %d, ~other %d: want the call team-a's", ts["team-a"].GetLiveCalls(), ts["team-b"].GetLiveCalls(), ts["~other"].GetLiveCalls())
	}
	_, err = client.Pick(asToken(ctx, "a-token"), &admissionv1.PickRequest{Scope: "chat", Tenant: "team-b"})
	wantTenantError(t, err, codes.PermissionDenied, admissionv1.ErrorReason_ERROR_REASON_TENANT_MISMATCH, map[string]string{"tenant": "team-a", "requested": "team-b"})
	if _, err := client.Pick(asToken(ctx, "app-token"), &admissionv1.PickRequest{Scope: "chat", Tenant: "team-b"}); err != nil {
		t.Fatalf("the application's token names its tenant: %v", err)
	}
}

// TestCertificateNamesTheTenant: with mutual TLS and tls.tenant_from:
// common_name, the client certificate's common name is the tenant.
func TestCertificateNamesTheTenant(t *testing.T) {
	ca := testcerts.NewCA(t)
	server, client := ca.Issue("polygate.test"), ca.Issue("team-a")
	s, _ := startScope(t, `  chat:
    tenants: {team-a: 1}
    sources: [{name: only}]
`, fmt.Sprintf("tls: {cert_file: %s, key_file: %s, client_ca_file: %s, tenant_from: common_name}", server.CertFile, server.KeyFile, ca.File))
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: ca.Pool, ServerName: "polygate.test", Certificates: []tls.Certificate{client.TLS},
	})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := admissionv1.NewAdmissionServiceClient(conn)
	ctx := testContext(t)
	if _, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"}); err != nil {
		t.Fatal(err)
	}
	if n := tenants(t, ctx, c, "chat")["team-a"].GetLiveCalls(); n != 1 {
		t.Fatalf("team-a's live calls %d, want the certificate's call", n)
	}
	_, err = c.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", Tenant: "team-b"})
	wantTenantError(t, err, codes.PermissionDenied, admissionv1.ErrorReason_ERROR_REASON_TENANT_MISMATCH, map[string]string{"tenant": "team-a", "requested": "team-b"})
}

// within fails the test unless d is in [lo, hi].
func within(t *testing.T, what string, d, lo, hi time.Duration) {
	t.Helper()
	if d < lo || d > hi {
		t.Fatalf("%s %v, want it in [%v, %v]", what, d, lo, hi)
	}
}

// TestTenantRPM: rpm 3 refuses the tenant's 4th Pick in the minute on every
// source with the time until its first request leaves the minute, while
// another tenant is granted.
func TestTenantRPM(t *testing.T) {
	eachBackend(t, func(t *testing.T, be orderBackend) { testTenantRPM(t, be, 1) })
}

// TestTenantRPMAcrossSidecars: on Redis the limit is the fleet's: the
// tenant's Picks spread over two sidecars.
func TestTenantRPMAcrossSidecars(t *testing.T) {
	testTenantRPM(t, orderBackends[1], 2)
}

func testTenantRPM(t *testing.T, be orderBackend, sidecars int) {
	scope := `  chat:
    quota_full: fail_fast
    tenants: {team: {rpm: 3}}
    sources: [{name: a}, {name: b}]
`
	backend := be.config(t)
	var clients []admissionv1.AdmissionServiceClient
	for range sidecars {
		_, c := startScope(t, scope, backend)
		clients = append(clients, c)
	}
	ctx := testContext(t)
	var first, firstDone time.Time
	for i := range 3 {
		before := time.Now()
		c := clients[i%sidecars]
		p, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", Tenant: "team"})
		if err != nil || p.GetGrant() == nil {
			t.Fatalf("Pick %d: %v %v", i+1, p, err)
		}
		if i == 0 {
			first, firstDone = before, time.Now()
		}
		if _, err := c.RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.GetCallId(),
			PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS}); err != nil {
			t.Fatal(err)
		}
	}
	before := time.Now()
	p, err := clients[len(clients)-1].Pick(ctx, &admissionv1.PickRequest{Scope: "chat", Tenant: "team"})
	after := time.Now()
	if err != nil || p.GetNoRunnable() == nil || len(p.GetNoRunnable().GetPerSourceReasons()) != 2 {
		t.Fatalf("the 4th Pick: %v %v, want refused on both sources", p, err)
	}
	for _, r := range p.GetNoRunnable().GetPerSourceReasons() {
		if r.GetReason() != admissionv1.Reason_REASON_TENANT_LIMIT {
			t.Fatalf("reasons %v, want tenant_limit", p.GetNoRunnable().GetPerSourceReasons())
		}
		// The first request leaves the minute at its admission + 1m.
		within(t, "retry_after", r.GetRetryAfter().AsDuration(), first.Add(time.Minute).Sub(after), firstDone.Add(time.Minute).Sub(before)+time.Millisecond)
	}
	if p, err := clients[0].Pick(ctx, &admissionv1.PickRequest{Scope: "chat", Tenant: "other"}); err != nil || p.GetGrant() == nil {
		t.Fatalf("another tenant: %v %v, want granted", p, err)
	}
}

// TestPriorityCeiling: a tenant with max_priority 0 asking for 2^31-1
// ranks as 0: a priority-1 call of another tenant that came later is served
// first, and DescribeScope's line shows the clamped priority.
func TestPriorityCeiling(t *testing.T) { eachBackend(t, testPriorityCeiling) }

func testPriorityCeiling(t *testing.T, be orderBackend) {
	_, client := startScope(t, `  chat:
    backpressure: {poll_interval: 500ms}
    tenants: {capped: {max_priority: 0}, vip: 1}
    sources: [{name: only, max_concurrency: 1}]
`, be.config(t))
	q := newQueue(t, client, "chat", 0)
	release := q.hold()
	q.call("capped", math.MaxInt32, "capped")
	q.until("the capped call in line", func() bool { return q.line().GetLength() == 1 })
	q.call("vip", 1, "vip")
	q.until("2 calls in line", func() bool { return q.line().GetLength() == 2 })
	groups := map[string]int32{}
	for _, g := range q.line().GetGroups() {
		groups[g.GetTenant()] = g.GetPriority()
	}
	if groups["capped"] != 0 || groups["vip"] != 1 {
		t.Fatalf("line groups %v, want capped at 0 and vip at 1", q.line().GetGroups())
	}
	release()
	q.wg.Wait()
	if order := q.granted(); len(order) != 2 || order[0] != "vip" {
		t.Fatalf("grant order %v, want vip first", order)
	}
}

// TestTenantMaxLiveCalls: max_live_calls 20 refuses the tenant's 21st open
// call, RESOURCE_EXHAUSTED with TENANT_TOO_MANY_CALLS, and nobody else's.
func TestTenantMaxLiveCalls(t *testing.T) { eachBackend(t, testTenantMaxLiveCalls) }

func testTenantMaxLiveCalls(t *testing.T, be orderBackend) {
	_, client := startScope(t, `  chat:
    tenants: {team: {max_live_calls: 20}}
    sources: [{name: only, max_concurrency: 100}]
`, be.config(t))
	ctx := testContext(t)
	for i := range 20 {
		if _, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", Tenant: "team"}); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	_, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", Tenant: "team"})
	wantTenantError(t, err, codes.ResourceExhausted, admissionv1.ErrorReason_ERROR_REASON_TENANT_TOO_MANY_CALLS, map[string]string{"tenant": "team"})
	for _, other := range []string{"other", ""} {
		if _, err := client.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", Tenant: other}); err != nil {
			t.Fatalf("tenant %q: %v", other, err)
		}
	}
	if n := tenants(t, ctx, client, "chat")["team"].GetLiveCalls(); n != 20 {
		t.Fatalf("team's live calls %d, want 20", n)
	}
}

// TestTokenBudget: a budget of 1 000 tokens per hour counts the actual
// tokens; the call that would exceed it ends with budget_exhausted and the
// time until the window's slice holding the first call leaves it (the
// window counts in 60 slices of a minute, from whole minutes).
func TestTokenBudget(t *testing.T) {
	eachBackend(t, func(t *testing.T, be orderBackend) { testTokenBudget(t, be, 1) })
}

// TestTokenBudgetAcrossSidecars: on Redis the budget is the fleet's.
func TestTokenBudgetAcrossSidecars(t *testing.T) {
	testTokenBudget(t, orderBackends[1], 2)
}

func testTokenBudget(t *testing.T, be orderBackend, sidecars int) {
	scope := `  chat:
    tenants: {team: {token_budget: {tokens: 1000, per: 1h}}}
    sources: [{name: only}]
`
	backend := be.config(t)
	var clients []admissionv1.AdmissionServiceClient
	for range sidecars {
		_, c := startScope(t, scope, backend)
		clients = append(clients, c)
	}
	ctx := testContext(t)
	before := time.Now()
	p, err := clients[0].Pick(ctx, &admissionv1.PickRequest{Scope: "chat", Tenant: "team", EstimatedTokens: 600})
	after := time.Now()
	if err != nil || p.GetGrant() == nil {
		t.Fatalf("first call: %v %v", p, err)
	}
	actual := int64(700)
	if _, err := clients[0].RecordOutcome(ctx, &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.GetCallId(),
		PermitId: p.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS, ActualTokens: &actual}); err != nil {
		t.Fatal(err)
	}
	// The first call's slice starts on the minute of its admission and
	// leaves the window an hour later.
	ends := func(at time.Time) time.Time { return at.Truncate(time.Minute).Add(time.Hour) }
	c := clients[len(clients)-1]
	p, err = c.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", Tenant: "team", EstimatedTokens: 400})
	if err != nil || p.GetNoRunnable() == nil || p.GetNoRunnable().GetPerSourceReasons()[0].GetReason() != admissionv1.Reason_REASON_TENANT_BUDGET {
		t.Fatalf("a call over the budget (700 spent + 400): %v %v, want refused tenant_budget", p, err)
	}
	if p, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "chat", Tenant: "team", EstimatedTokens: 300}); err != nil || p.GetGrant() == nil {
		t.Fatalf("a call within the budget (700 + 300): %v %v", p, err)
	}
	askedAt := time.Now()
	d, err := c.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: p.GetCallId()})
	answeredAt := time.Now()
	if err != nil || d.GetFailure().GetReason() != admissionv1.FailureReason_FAILURE_REASON_BUDGET_EXHAUSTED {
		t.Fatalf("OnNoRunnable: %v %v, want budget_exhausted", d, err)
	}
	within(t, "retry_after", d.GetFailure().GetRetryAfter().AsDuration(),
		ends(before).Sub(answeredAt), ends(after).Sub(askedAt)+time.Millisecond)
	if used := tenants(t, ctx, c, "chat")["team"].GetBudgetUsed(); used != 1000 {
		t.Fatalf("budget used %d, want 1000 (700 actual + 300 estimated)", used)
	}
}

// TestWeightsSurviveOneOffTenants: gold (4) against x (1) still gets 0.8 ±
// 0.05 of their grants when they join a line that 100 one-off tenant names
// are passing through, more than max_tenants (64).
func TestWeightsSurviveOneOffTenants(t *testing.T) {
	eachBackend(t, func(t *testing.T, be orderBackend) { testWeightsSurviveOneOffTenants(t, be, 1) })
}

// TestWeightsSurviveOneOffTenantsAcrossSidecars: on Redis, with gold's
// calls on one sidecar and x's on another.
func TestWeightsSurviveOneOffTenantsAcrossSidecars(t *testing.T) {
	testWeightsSurviveOneOffTenants(t, orderBackends[1], 2)
}

func testWeightsSurviveOneOffTenants(t *testing.T, be orderBackend, sidecars int) {
	scope := `  chat:
    backpressure: {poll_interval: 100ms}
    tenants: {gold: 4, x: 1}
    sources: [{name: only, max_concurrency: 2}]
`
	// Every waiting call holds a stream of the one connection.
	backend := be.config(t) + "\nlimits: {max_streams_per_connection: 1024}"
	_, client := startScope(t, scope, backend)
	q := newQueue(t, client, "chat", 10*time.Millisecond)
	if sidecars == 2 {
		_, other := startScope(t, scope, backend)
		q.via["x"] = other
	}
	r1, r2 := q.hold(), q.hold()
	for i := range 100 {
		q.call("once", 0, fmt.Sprintf("once-%d", i))
	}
	q.until("100 one-off tenants in line", func() bool { return q.line().GetLength() == 100 })
	for range 100 {
		q.call("gold", 0, "gold")
		q.call("x", 0, "x")
	}
	q.until("300 calls in line", func() bool { return q.line().GetLength() == 300 })
	r1()
	r2()
	q.wg.Wait()
	var named []string
	for _, l := range q.granted() {
		if l != "once" {
			named = append(named, l)
		}
	}
	share := float64(countOf(named[:100], "gold")) / 100
	t.Logf("gold's share of the first 100 grants of gold and x: %.3f", share)
	if share < 0.75 || share > 0.85 {
		t.Fatalf("gold's share %.3f, want 0.8 ± 0.05 (weights 4:1): %v", share, named[:100])
	}
}
