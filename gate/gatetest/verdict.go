package gatetest

import (
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// runVerdict checks that Peek's verdict is Admit's own answer: in every state
// a source can refuse in, the verdict of a Peek equals the rejection of an
// Admit right after it (and ReasonNone exactly when that Admit grants).
func runVerdict(t *testing.T, factory Factory) {
	type state struct {
		name    string
		src     func(*gate.Source)
		ceiling int
		tokens  int64
		setup   func(e *env, src *gate.Source)
		want    gate.Reason
	}
	states := []state{
		{name: "Idle", want: gate.ReasonNone},
		{
			name: "ConcurrencyFull", want: gate.ReasonRateLimited,
			src:   func(s *gate.Source) { s.Limits.MaxConcurrency = 1 },
			setup: func(e *env, src *gate.Source) { e.grant(src) },
		},
		{
			name: "PacerCeiling", want: gate.ReasonAdaptivePaced, ceiling: 1,
			src:   func(s *gate.Source) { s.Limits.MaxConcurrency = 2 },
			setup: func(e *env, src *gate.Source) { e.grant(src) },
		},
		{
			name: "UnderTheCeiling", want: gate.ReasonNone, ceiling: 2,
			src:   func(s *gate.Source) { s.Limits.MaxConcurrency = 3 },
			setup: func(e *env, src *gate.Source) { e.grant(src) },
		},
		{
			name: "RPMFull", want: gate.ReasonRateLimited,
			src: func(s *gate.Source) { s.Limits.RPM = 1 },
			setup: func(e *env, src *gate.Source) {
				e.attempt(src, gate.VerdictSuccess)
				e.clock.Advance(20 * time.Second)
			},
		},
		{
			name: "TPMFullForTheseTokens", want: gate.ReasonRateLimited, tokens: 60,
			src: func(s *gate.Source) { s.Limits.TPM = 100 },
			setup: func(e *env, src *gate.Source) {
				a := e.admit(50, src)
				e.settle(src, a.Permit, gate.VerdictSuccess)
				e.clock.Advance(time.Second)
			},
		},
		{
			name: "TPMRoomForFewerTokens", want: gate.ReasonNone, tokens: 50,
			src: func(s *gate.Source) { s.Limits.TPM = 100 },
			setup: func(e *env, src *gate.Source) {
				a := e.admit(50, src)
				e.settle(src, a.Permit, gate.VerdictSuccess)
			},
		},
		{
			name: "Open", want: gate.ReasonCircuitOpen,
			setup: func(e *env, src *gate.Source) { e.open(src); e.clock.Advance(300 * time.Millisecond) },
		},
		{
			name: "CooldownElapsed", want: gate.ReasonNone,
			setup: func(e *env, src *gate.Source) { e.open(src); e.clock.Advance(src.Breaker.Cooldown) },
		},
		{
			name: "ProbeInFlight", want: gate.ReasonProbeInFlight,
			setup: func(e *env, src *gate.Source) { e.open(src); e.clock.Advance(src.Breaker.Cooldown); e.grant(src) },
		},
		{
			name: "ForcedOpen", want: gate.ReasonForcedOpen,
			setup: func(e *env, src *gate.Source) { e.override(src, gate.ActionForceOpen) },
		},
	}
	for _, st := range states {
		t.Run(st.name, func(t *testing.T) {
			e := newEnv(t, factory)
			var opts []func(*gate.Source)
			if st.src != nil {
				opts = append(opts, st.src)
			}
			src := Src("a", opts...)
			if st.setup != nil {
				st.setup(e, src)
			}
			ceiling := src.Limits.MaxConcurrency
			if st.ceiling > 0 {
				ceiling = st.ceiling
			}
			snap, err := e.b.Peek(e.ctx, gate.PeekRequest{Scope: e.scope, Sources: []*gate.Source{src}, Ceilings: []int{ceiling}, Tokens: st.tokens})
			if err != nil {
				t.Fatalf("Peek: %v", err)
			}
			v := snap.Sources[0].Verdict
			if v.Reason != st.want || v.Source != src.Name {
				t.Fatalf("verdict %+v, want %v", v, st.want)
			}
			a := e.admitCandidates(st.tokens, []gate.Candidate{{Source: src, Ceiling: ceiling}})
			if a.Granted != (v.Reason == gate.ReasonNone) {
				t.Fatalf("verdict %+v but Admit %+v", v, a)
			}
			if !a.Granted && a.Rejections[0] != v {
				t.Fatalf("verdict %+v, Admit's rejection %+v", v, a.Rejections[0])
			}
		})
	}

	t.Run("MissingCeilingIsMaxConcurrency", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Limits.MaxConcurrency = 2 })
		e.grant(src)
		if v := e.view(src).Verdict; v.Reason != gate.ReasonNone {
			t.Fatalf("verdict without ceilings %+v, want none", v)
		}
	})
}
