package gatetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

func runOverrides(t *testing.T, factory Factory) {
	// An override's actor and why are at most gate.MaxText bytes each: a
	// longer one is refused before anything is stored (a backend that
	// stored it would read it back as corrupt), an unknown action too; the
	// longest allowed is kept whole.
	t.Run("OverrideTextBounded", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		long := strings.Repeat("x", gate.MaxText+1)
		for _, req := range []gate.OverrideRequest{
			{Action: gate.ActionForceOpen, Actor: long, Why: "w"},
			{Action: gate.ActionForceOpen, Actor: "a", Why: long},
			{Action: gate.Action(99), Actor: "a", Why: "w"},
		} {
			req.Scope, req.Source = e.scope, src
			if _, err := e.b.Override(e.ctx, req); err == nil || strings.Contains(err.Error(), long) {
				t.Fatalf("Override(action %v, actor %d bytes, why %d bytes): %v, want an error without the text", req.Action, len(req.Actor), len(req.Why), err)
			} else if req.Action == gate.Action(99) && !errors.Is(err, gate.ErrUnknownAction) {
				t.Fatalf("unknown action: %v, want gate.ErrUnknownAction", err)
			}
		}
		if v := e.view(src).Breaker; v.Override != gate.NoOverride {
			t.Fatalf("a refused override was stored: %+v", v)
		}
		e.grant(src)
		longest := long[1:]
		r, err := e.b.Override(e.ctx, gate.OverrideRequest{Scope: e.scope, Source: src, Action: gate.ActionForceOpen, Actor: longest, Why: longest})
		if err != nil || r.View.Breaker.Actor != longest || r.View.Breaker.Why != longest {
			t.Fatalf("an override of %d-byte texts: %v, view actor %d why %d bytes", gate.MaxText, err, len(r.View.Breaker.Actor), len(r.View.Breaker.Why))
		}
		if v := e.view(src).Breaker; v.Why != longest {
			t.Fatalf("read back: why of %d bytes, want %d", len(v.Why), gate.MaxText)
		}
	})

	t.Run("ForceOpenPersistsUntilCleared", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		before := e.grant(src)
		r := e.override(src, gate.ActionForceOpen)
		if r.View.Breaker.Override != gate.ForcedOpen || r.View.Breaker.Actor != "tester" || r.View.Breaker.Why != "contract" {
			t.Fatalf("override view: %+v", r.View.Breaker)
		}
		if !hasEvent(r.Events, gate.EventOverride) {
			t.Fatalf("events = %+v", r.Events)
		}
		if rej := e.refuse(src); rej.Reason != gate.ReasonForcedOpen || rej.RetryAfter != 0 {
			t.Fatalf("forced open refusal: %+v", rej)
		}
		// Outcomes and time do not clear it.
		e.settle(src, before, gate.VerdictSuccess)
		e.clock.Advance(time.Hour)
		if rej := e.refuse(src); rej.Reason != gate.ReasonForcedOpen {
			t.Fatalf("after an outcome and an hour: %+v", rej)
		}
		e.override(src, gate.ActionClear)
		e.grant(src)
	})

	t.Run("ForceClosedAdmitsAndKeepsCounting", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		e.override(src, gate.ActionForceClosed)
		for range 5 {
			e.attempt(src, gate.VerdictFailure)
		}
		v := e.view(src).Breaker
		if v.State != gate.Open || v.Override != gate.ForcedClosed || v.Reason != gate.ReasonNone {
			t.Fatalf("forced closed after failures: %+v, want automatic state open but admitting", v)
		}
		e.clock.Advance(10 * time.Second) // past any cooldown: still no probe semantics
		p := e.grant(src)
		if p.Probe {
			t.Fatalf("forced closed handed out a probe")
		}
		e.override(src, gate.ActionClear)
		if p := e.grant(src); !p.Probe {
			t.Fatalf("after clearing, the open breaker's cooldown has elapsed: want the probe, got %+v", p)
		}
	})

	t.Run("DisabledRecordsNothing", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		e.override(src, gate.ActionDisable)
		for range 5 {
			if s := e.attempt(src, gate.VerdictFailure); s.Effect != gate.EffectIgnored {
				t.Fatalf("effect = %v, want ignored", s.Effect)
			}
		}
		e.override(src, gate.ActionClear)
		if v := e.view(src).Breaker; v.State != gate.Closed || v.Consecutive != 0 {
			t.Fatalf("after disabled failures: %+v", v)
		}
	})

	t.Run("ResetClosesAndFencesOldOutcomes", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		late := e.grant(src)
		e.open(src)
		r := e.override(src, gate.ActionReset)
		if r.View.Breaker.State != gate.Closed || r.View.Breaker.Reopens != 0 || r.View.Breaker.Override != gate.NoOverride {
			t.Fatalf("after reset: %+v", r.View.Breaker)
		}
		if s := e.settle(src, late, gate.VerdictFailure); s.Effect != gate.EffectStale {
			t.Fatalf("pre-reset outcome: %v, want stale", s.Effect)
		}
		e.grant(src)
	})
}
