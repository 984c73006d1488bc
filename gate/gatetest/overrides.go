package gatetest

import (
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

func runOverrides(t *testing.T, factory Factory) {
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
