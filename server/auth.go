package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"sync/atomic"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"google.golang.org/grpc"

	"github.com/polygate/polygate/config"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// errPermissionDenied: the application's token on an operator's RPC.
var errPermissionDenied = errors.New("this RPC needs auth.operator_token; the application's token is not enough")

// operatorMethods need auth.operator_token when it is set: they change or
// reveal every client's state.
var operatorMethods = map[string]bool{
	admissionv1.AdmissionService_OverrideBreaker_FullMethodName: true,
	admissionv1.AdmissionService_WatchEvents_FullMethodName:     true,
}

// Tokens are the bearer tokens of the two roles: the application's
// (auth.token) for the admission RPCs, the operator's (auth.operator_token)
// for OverrideBreaker and WatchEvents. Set replaces them at once, so a
// reload (SIGHUP re-reading auth.token_file) takes effect on the next RPC.
type Tokens struct {
	v atomic.Pointer[digests]
}

// digests are the tokens' SHA-256 sums: comparing them in constant time
// reveals neither a token's bytes nor its length.
type digests struct {
	app, operator *[sha256.Size]byte // nil: not set
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
	t.v.Store(&digests{app: digest(a.Token), operator: digest(a.OperatorToken)})
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

// authenticate admits a call by its bearer token and its method's role:
// an operator method needs the operator token when one is set (the
// application's token gets PERMISSION_DENIED); every other method, and
// every method when no operator token is set, takes the application's
// token (or the operator's). With no token set, everything is open.
func (t *Tokens) authenticate(ctx context.Context) (context.Context, error) {
	d := t.v.Load()
	if d.app == nil && d.operator == nil {
		return ctx, nil // no token set: open, without reading the metadata
	}
	var got *[sha256.Size]byte
	if bearer, err := auth.AuthFromMD(ctx, "bearer"); err == nil {
		got = digest(bearer)
	}
	operator := d.is(d.operator, got)
	app := d.app == nil || d.is(d.app, got)
	method, _ := grpc.Method(ctx)
	switch {
	case operator:
		return ctx, nil
	case operatorMethods[method] && d.operator != nil:
		if app {
			return nil, errPermissionDenied
		}
		return nil, errUnauthenticated
	case app:
		return ctx, nil
	}
	return nil, errUnauthenticated
}
