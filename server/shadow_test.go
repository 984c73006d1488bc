package server

import (
	"errors"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/inmem"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// A shadow grant says which error enforcement would have answered, with the
// reason the error's ErrorInfo would carry.
func TestShadowGrantSaysTheErrorEnforcementWouldAnswer(t *testing.T) {
	const yaml = `
scopes:
  chat:
    mode: shadow
    sources: [{name: a, tpm: 1000}, {name: b, tpm: 1000}]
`
	for _, tc := range []struct {
		name    string
		backend gate.Backend
		tokens  int64
		want    admissionv1.ErrorReason
	}{
		{"estimate above every tpm", inmem.New(time.Now), 5000, admissionv1.ErrorReason_ERROR_REASON_ESTIMATE_TOO_LARGE},
		{"backend unavailable", brokenBackend{err: errors.Join(gate.ErrUnavailable, errors.New("dial tcp: refused"))}, 100, admissionv1.ErrorReason_ERROR_REASON_BACKEND_UNAVAILABLE},
		{"none", inmem.New(time.Now), 100, admissionv1.ErrorReason_ERROR_REASON_UNSPECIFIED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, harnessOpts{yaml: yaml, backend: tc.backend})
			g := h.pick(t, &admissionv1.PickRequest{Scope: "chat", EstimatedTokens: tc.tokens}).GetGrant()
			if !g.GetShadow() || g.GetShadowError() != tc.want {
				t.Fatalf("grant %v; want a shadow grant with shadow_error %v", g, tc.want)
			}
		})
	}
}
