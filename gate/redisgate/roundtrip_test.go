package redisgate_test

import (
	"slices"
	"testing"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestOneRoundTripPerCall counts the commands each Backend method sends: one
// FCALL, plus FUNCTION LOAD and the FCALL again the first time the server
// lacks the library (here after a FUNCTION FLUSH, as after a restart).
func TestOneRoundTripPerCall(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	clock := gatetest.NewClock()
	hook := &redistest.Recorder{}
	c := srv.Client(t)
	c.AddHook(hook)
	b := newBackend(t, c, redisgate.Options{Clock: clock.Now})
	const scope = "rtt"
	// The walk visits every candidate: a is full, b is open, c grants.
	a := gatetest.Src("a", func(s *gate.Source) { s.Limits.MaxConcurrency = 1; s.Limits.RPM = 10; s.Limits.TPM = 1000 })
	bs, cs := gatetest.Src("b"), gatetest.Src("c", func(s *gate.Source) { s.Limits.RPM = 10 })
	admit(t, ctx, b, scope, "hold", a)
	openBreaker(t, ctx, b, scope, bs)
	must(c.FunctionFlush(ctx).Result())(t)
	hook.Take()

	n := 0
	calls := []struct {
		name string
		call func() error
	}{
		{"admit", func() error {
			n++
			cands := []gate.Candidate{{Source: a, Ceiling: 1}, {Source: bs, Ceiling: 100}, {Source: cs, Ceiling: 100}}
			adm, err := b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: "x" + string(rune('a'+n)), Tokens: 3, Candidates: cands})
			if err == nil && (!adm.Granted || len(adm.Rejections) != 2) {
				t.Fatalf("walk: %+v, want two refusals then a grant", adm)
			}
			return err
		}},
		{"settle", func() error {
			_, err := b.Settle(ctx, gate.SettleRequest{Scope: scope, Source: cs, PermitID: "xb", Verdict: gate.VerdictSuccess, ActualTokens: 5, Progress: true})
			return err
		}},
		{"peek", func() error {
			_, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{a, bs, cs}})
			return err
		}},
		{"override", func() error {
			_, err := b.Override(ctx, gate.OverrideRequest{Scope: scope, Source: cs, Action: gate.ActionClear})
			return err
		}},
	}
	for _, call := range calls {
		for round := range 3 {
			if err := call.call(); err != nil {
				t.Fatalf("%s: %v", call.name, err)
			}
			got, _ := hook.Take()
			want := []string{"fcall"}
			if round == 0 && call.name == "admit" {
				want = []string{"fcall", "function", "fcall"} // not found after the flush: loaded once
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s, call %d sent %v, want %v", call.name, round+1, got, want)
			}
		}
	}
}
