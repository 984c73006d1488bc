package server

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/polygate/polygate/config"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

const tenantConfig = `
calls: {max_live: 100, idle_timeout: 1m}
scopes:
  chat:
    tenants: {team-a: {max_live_calls: 2}, team-b: {max_live_calls: 5}}
    default_tenant: {max_live_calls: 3}
    sources: [{name: only, max_concurrency: 100, timeout: 30s}]
`

// tenantMeta reads an error's ErrorInfo metadata.
func errorMeta(t *testing.T, err error) map[string]string {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.Metadata
		}
	}
	t.Fatalf("no ErrorInfo in %v", err)
	return nil
}

// live reads the calls DescribeScope counts for each tenant.
func (h *harness) tenantsLive(t *testing.T) map[string]int32 {
	t.Helper()
	d, err := h.client.DescribeScope(h.as("app"), &admissionv1.DescribeScopeRequest{Scope: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int32{}
	for _, ts := range d.GetScope().GetTenants() {
		out[ts.GetName()] = ts.GetLiveCalls()
	}
	return out
}

func (h *harness) as(token string) context.Context {
	return metadata.AppendToOutgoingContext(h.ctx, "authorization", "Bearer "+token)
}

// TestTenantTokensNameTheTenant: a tenant token is its tenant: a Pick
// without a tenant takes it, one naming it is served, one naming another is
// PERMISSION_DENIED naming both; nor may it act on another tenant's call.
// The application's token lets the request name its tenant.
func TestTenantTokensNameTheTenant(t *testing.T) {
	h := start(t, harnessOpts{yaml: tenantConfig, auth: &config.Auth{Token: "app", TenantTokens: []config.TenantToken{
		{Tenant: "team-a", Token: "ta"}, {Tenant: "team-b", Token: "tb"},
	}}})
	mine, err := h.client.Pick(h.as("ta"), &admissionv1.PickRequest{Scope: "chat"})
	if err != nil || mine.GetGrant() == nil {
		t.Fatalf("Pick with team-a's token: %v %v", mine, err)
	}
	if _, err := h.client.Pick(h.as("ta"), &admissionv1.PickRequest{Scope: "chat", Tenant: "team-a"}); err != nil {
		t.Fatalf("Pick naming the token's own tenant: %v", err)
	}
	_, err = h.client.Pick(h.as("ta"), &admissionv1.PickRequest{Scope: "chat", Tenant: "team-b"})
	wantStatus(t, err, codes.PermissionDenied, admissionv1.ErrorReason_ERROR_REASON_TENANT_MISMATCH, "")
	if m := errorMeta(t, err); m["tenant"] != "team-a" || m["requested"] != "team-b" {
		t.Fatalf("metadata %v, want tenant team-a and requested team-b", m)
	}
	theirs, err := h.client.Pick(h.as("app"), &admissionv1.PickRequest{Scope: "chat", Tenant: "team-b"})
	if err != nil {
		t.Fatalf("Pick with the application's token naming team-b: %v", err)
	}
	_, err = h.client.RecordOutcome(h.as("ta"), &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: theirs.GetCallId(),
		PermitId: theirs.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
	wantStatus(t, err, codes.PermissionDenied, admissionv1.ErrorReason_ERROR_REASON_TENANT_MISMATCH, "")
	if _, err := h.client.RecordOutcome(h.as("tb"), &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: theirs.GetCallId(),
		PermitId: theirs.GetGrant().GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS}); err != nil {
		t.Fatalf("team-b's token on team-b's call: %v", err)
	}
	if live := h.tenantsLive(t); live["team-a"] != 2 || live["team-b"] != 0 {
		t.Fatalf("live calls by tenant %v, want team-a's two open", live)
	}
	_, err = h.client.Pick(h.as("nope"), &admissionv1.PickRequest{Scope: "chat"})
	wantStatus(t, err, codes.Unauthenticated, admissionv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED, "")
}

// TestTenantMaxLiveCalls: a tenant at max_live_calls is refused its next
// call (RESOURCE_EXHAUSTED, TENANT_TOO_MANY_CALLS) and nobody else is;
// tenants the scope does not name share default_tenant's.
func TestTenantMaxLiveCalls(t *testing.T) {
	h := start(t, harnessOpts{yaml: tenantConfig})
	open := func(tenant string) error {
		_, err := h.client.Pick(h.ctx, &admissionv1.PickRequest{Scope: "chat", Tenant: tenant})
		return err
	}
	for range 2 {
		if err := open("team-a"); err != nil {
			t.Fatal(err)
		}
	}
	err := open("team-a")
	wantStatus(t, err, codes.ResourceExhausted, admissionv1.ErrorReason_ERROR_REASON_TENANT_TOO_MANY_CALLS, "")
	if m := errorMeta(t, err); m["tenant"] != "team-a" {
		t.Fatalf("metadata %v", m)
	}
	for _, tenant := range []string{"team-b", "x", "y", ""} {
		if err := open(tenant); err != nil {
			t.Fatalf("%q: %v", tenant, err)
		}
	}
	wantStatus(t, open("z"), codes.ResourceExhausted, admissionv1.ErrorReason_ERROR_REASON_TENANT_TOO_MANY_CALLS, "")
	if live := h.tenantsLive(t); live["team-a"] != 2 || live["team-b"] != 1 || live["~other"] != 3 {
		t.Fatalf("live calls by tenant %v", live)
	}
}

// TestCertTenant: what a client certificate names as its tenant.
func TestCertTenant(t *testing.T) {
	uri := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: "team-a"}, URIs: []*url.URL{uri("spiffe://example.org/ns/prod/sa/team-b/"), uri("spiffe://x/y")}}
	for _, tc := range []struct {
		cert *x509.Certificate
		from string
		want string
	}{
		{cert, config.TenantFromCommonName, "team-a"},
		{cert, config.TenantFromURISAN, "team-b"},
		{&x509.Certificate{URIs: []*url.URL{uri("urn:team-c")}}, config.TenantFromURISAN, "team-c"},
		{&x509.Certificate{}, config.TenantFromURISAN, ""},
	} {
		if got := certTenant(tc.cert, tc.from); got != tc.want {
			t.Errorf("%s of %v = %q, want %q", tc.from, tc.cert.URIs, got, tc.want)
		}
	}
}
