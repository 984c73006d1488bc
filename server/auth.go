package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/polygate/polygate/config"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// errPermissionDenied: the application's token on an operator's RPC.
var errPermissionDenied = errors.New("this RPC needs auth.operator_token; the application's token is not enough")

// errNoCertTenant: tls.tenant_from is set and the client certificate names
// no valid tenant.
var errNoCertTenant = fmt.Errorf("%w: the client certificate names no tenant (tls.tenant_from)", errUnauthenticated)

// operatorMethods need auth.operator_token when it is set: they change or
// reveal every client's state.
var operatorMethods = map[string]bool{
	admissionv1.AdmissionService_OverrideBreaker_FullMethodName: true,
	admissionv1.AdmissionService_WatchEvents_FullMethodName:     true,
}

// Tokens are the bearer tokens of the two roles: the application's
// (auth.token, and auth.tenant_tokens, each of which also names its
// caller's tenant) for the admission RPCs, the operator's
// (auth.operator_token) for OverrideBreaker and WatchEvents; and how a
// client certificate names its caller's tenant (tls.tenant_from). Set
// replaces them at once, so a reload (SIGHUP re-reading the token files)
// takes effect on the next RPC.
type Tokens struct {
	v atomic.Pointer[digests]
}

// digests are the tokens' SHA-256 sums: comparing them in constant time
// reveals neither a token's bytes nor its length.
type digests struct {
	app, operator *[sha256.Size]byte // nil: not set
	tenants       []tenantDigest
	tenantFrom    string
}

// tenantDigest is a tenant token's sum and the tenant it names.
type tenantDigest struct {
	sum    [sha256.Size]byte
	tenant string
}

// NewTokens holds a's tokens.
func NewTokens(a config.Auth) *Tokens {
	t := &Tokens{}
	t.Set(a)
	return t
}

// Set replaces the tokens with a's; the composition root calls it after a
// configuration reload.
func (t *Tokens) Set(a config.Auth) {
	d := &digests{app: digest(a.Token), operator: digest(a.OperatorToken), tenantFrom: a.TenantFrom}
	for _, tt := range a.TenantTokens {
		d.tenants = append(d.tenants, tenantDigest{sum: sha256.Sum256([]byte(tt.Token)), tenant: tt.Tenant})
	}
	t.v.Store(d)
}

func digest(token string) *[sha256.Size]byte {
	if token == "" {
		return nil
	}
	d := sha256.Sum256([]byte(token))
	return &d
}

func (d *digests) is(want *[sha256.Size]byte, got *[sha256.Size]byte) bool {
	return want != nil && got != nil && subtle.ConstantTimeCompare(want[:], got[:]) == 1
}

// tenantOf is the tenant whose token got is ("" none), comparing every
// tenant token in constant time.
func (d *digests) tenantOf(got *[sha256.Size]byte) string {
	tenant := ""
	if got == nil {
		return ""
	}
	for i := range d.tenants {
		if subtle.ConstantTimeCompare(d.tenants[i].sum[:], got[:]) == 1 {
			tenant = d.tenants[i].tenant
		}
	}
	return tenant
}

// authenticate admits a call by its bearer token and its method's role:
// an operator method needs the operator token when one is set (the
// application's tokens get PERMISSION_DENIED); every other method, and
// every method when no operator token is set, takes an application's
// token (auth.token or a tenant token) or the operator's. With no token
// set, everything is open. A tenant token, or the client certificate with
// tls.tenant_from, names the caller's tenant (callerTenant); the two must
// agree.
func (t *Tokens) authenticate(ctx context.Context) (context.Context, error) {
	d := t.v.Load()
	certTenant := ""
	if d.tenantFrom != "" {
		var err error
		if certTenant, err = peerTenant(ctx, d.tenantFrom); err != nil {
			return nil, err
		}
	}
	if d.app == nil && d.operator == nil && len(d.tenants) == 0 {
		return withTenant(ctx, certTenant), nil // no token set: open, without reading the metadata
	}
	var got *[sha256.Size]byte
	if bearer, err := auth.AuthFromMD(ctx, "bearer"); err == nil {
		got = digest(bearer)
	}
	operator := d.is(d.operator, got)
	tenant := d.tenantOf(got)
	app := tenant != "" || d.is(d.app, got) || (d.app == nil && len(d.tenants) == 0)
	if tenant != "" && certTenant != "" && tenant != certTenant {
		return nil, &tenantError{err: errTenantMismatch, tenant: tenant, requested: certTenant, by: "the client certificate"}
	}
	if tenant == "" {
		tenant = certTenant
	}
	method, _ := grpc.Method(ctx)
	switch {
	case operator:
		return withTenant(ctx, tenant), nil
	case operatorMethods[method] && d.operator != nil:
		if app {
			return nil, errPermissionDenied
		}
		return nil, errUnauthenticated
	case app:
		return withTenant(ctx, tenant), nil
	}
	return nil, errUnauthenticated
}

// tenantKey is the context key of the tenant a caller's credential names.
type tenantKey struct{}

func withTenant(ctx context.Context, tenant string) context.Context {
	if tenant == "" {
		return ctx
	}
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// credentialTenant is the tenant the caller's credential names ("" none).
func credentialTenant(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

// callerTenant is the tenant of a request that names requested ("" none):
// the credential's when it names one (a request may repeat it, never name
// another), else the request's.
func callerTenant(ctx context.Context, requested string) (string, error) {
	own := credentialTenant(ctx)
	switch {
	case own == "":
		return requested, nil
	case requested == "" || requested == own:
		return own, nil
	}
	return "", &tenantError{err: errTenantMismatch, tenant: own, requested: requested, by: "the request"}
}

// peerTenant is the tenant the client certificate names by from (a verified
// chain's leaf: its first URI SAN's last path segment, or its common name);
// a certificate that names no valid tenant is not authenticated.
func peerTenant(ctx context.Context, from string) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", errNoCertTenant
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", errNoCertTenant
	}
	tenant := certTenant(info.State.VerifiedChains[0][0], from)
	if !config.ValidName(tenant) {
		return "", errNoCertTenant
	}
	return tenant, nil
}

// certTenant is what cert names as its tenant by from ("" nothing).
func certTenant(cert *x509.Certificate, from string) string {
	switch from {
	case config.TenantFromCommonName:
		return cert.Subject.CommonName
	case config.TenantFromURISAN:
		if len(cert.URIs) == 0 {
			return ""
		}
		u := cert.URIs[0]
		p := strings.TrimRight(u.Path, "/")
		if p == "" {
			return u.Opaque
		}
		return p[strings.LastIndexByte(p, '/')+1:]
	}
	return ""
}
