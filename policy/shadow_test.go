package policy_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/policy"
)

// failingAdmits is a backend whose Admits fail with err.
type failingAdmits struct {
	gate.Backend
	err error
}

func (f failingAdmits) Admit(context.Context, gate.AdmitRequest) (gate.Admission, error) {
	return gate.Admission{}, f.err
}

// Shadow mode never refuses for a limit nor for the backend: a Pick that
// enforcement would answer with an error is granted, with the error it would
// have answered (ShadowError) and, for an estimate above every source's tpm,
// each source's refusal. Enforcement answers the error; an error that is
// not the backend's unavailability fails the Pick in shadow mode too.
func TestShadowGrantsWhatEnforcementAnswersWithAnError(t *testing.T) {
	const sources = "sources: [{name: a, tpm: 1000}, {name: b, tpm: 1000}]\n"
	unavailable := fmt.Errorf("redisgate: admit: %w: %w", gate.ErrUnavailable, context.DeadlineExceeded)
	broken := errors.New("lua: attempt to index nil")
	for _, tc := range []struct {
		name     string
		mode     string
		tokens   int64
		err      error // of the backend's Admit
		want     error // the Pick's error, or the grant's ShadowError in shadow mode
		refusals string
	}{
		{"estimate above every tpm", "shadow", 5000, nil, policy.ErrEstimateTooLarge, "a:rate_limited:0s b:rate_limited:0s "},
		{"backend unavailable", "shadow", 100, unavailable, gate.ErrUnavailable, ""},
		{"backend broken", "shadow", 100, broken, broken, ""},
		{"estimate above every tpm, enforced", "enforce", 5000, nil, policy.ErrEstimateTooLarge, ""},
		{"backend unavailable, enforced", "enforce", 100, unavailable, gate.ErrUnavailable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte("scopes:\n  s:\n"+indent("mode: "+tc.mode+"\n"+sources)), nil)
			if err != nil {
				t.Fatal(err)
			}
			var b gate.Backend = inmem.New(time.Now)
			if tc.err != nil {
				b = failingAdmits{b, tc.err}
			}
			s := policy.NewScope(cfg.Scopes["s"], b, policy.Options{Rand: half})
			t.Cleanup(s.Close)
			c := policy.NewCall(policy.NewID("c"), s.Name(), tc.tokens, time.Time{}, time.Now())
			p, err := s.Pick(ctx(t), c)
			if tc.mode == "enforce" || tc.err == broken {
				if !errors.Is(err, tc.want) {
					t.Fatalf("Pick: %+v, %v; want the error %v", p, err, tc.want)
				}
				return
			}
			if err != nil || p.Grant == nil || !p.Grant.Shadow {
				t.Fatalf("Pick: %+v, %v; want a shadow grant", p, err)
			}
			g := p.Grant
			if !errors.Is(g.ShadowError, tc.want) || reasons(g.ShadowRefusals) != tc.refusals {
				t.Fatalf("shadow grant on %s: error %v, refusals %s; want %v, %s", g.Source.Name, g.ShadowError, reasons(g.ShadowRefusals), tc.want, tc.refusals)
			}
		})
	}
}
