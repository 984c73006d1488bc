package gatetest

import (
	"sync"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// runProbe is the breaker's HALF_OPEN contract: one probe at a time, its
// lease, its outcome, and the outcomes of permits of an earlier epoch.
func runProbe(t *testing.T, factory Factory) {
	t.Run("OneProbeAmongConcurrentEntrants", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		e.open(src)
		e.clock.Advance(time.Second)
		const n = 16
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			probes   int
			refusals []gate.Rejection
		)
		for range n {
			wg.Go(func() {
				a := e.admit(0, src)
				mu.Lock()
				defer mu.Unlock()
				if a.Granted && a.Permit.Probe {
					probes++
				}
				refusals = append(refusals, a.Rejections...)
			})
		}
		wg.Wait()
		if probes != 1 || len(refusals) != n-1 {
			t.Fatalf("probes = %d, refusals = %d; want 1 and %d", probes, len(refusals), n-1)
		}
		for _, r := range refusals {
			if r.Reason != gate.ReasonProbeInFlight || r.RetryAfter != 0 {
				t.Fatalf("refusal %+v, want probe_in_flight with retry_after 0", r)
			}
		}
	})

	t.Run("ProbeSuccessCloses", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", rate)
		// Open through the rate channel so the window holds failures.
		for range 4 {
			e.attempt(src, gate.VerdictFailure)
		}
		e.clock.Advance(time.Second)
		s := e.settle(src, e.grant(src), gate.VerdictSuccess)
		if s.Breaker.State != gate.Closed || s.Breaker.Reopens != 0 || s.Breaker.Calls != 0 || s.Breaker.Consecutive != 0 {
			t.Fatalf("after probe success: %+v, want closed with a clean window", s.Breaker)
		}
		if len(s.Events) != 1 || s.Events[0].Cause != gate.CauseProbeSucceeded || s.Events[0].To != gate.Closed {
			t.Fatalf("events = %+v", s.Events)
		}
	})

	t.Run("ExpiredProbeLeaseLetsOneNewProbe", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a") // probe_ttl 5s
		e.open(src)
		e.clock.Advance(time.Second)
		old := e.grant(src)
		e.clock.Advance(5*time.Second - time.Millisecond)
		if r := e.refuse(src); r.Reason != gate.ReasonProbeInFlight {
			t.Fatalf("before the lease ends: %+v", r)
		}
		e.clock.Advance(time.Millisecond)
		a := e.admit(0, src)
		if !a.Granted || !a.Permit.Probe || a.Permit.Epoch != old.Epoch+1 {
			t.Fatalf("after the lease: %+v, want a probe at epoch %d", a, old.Epoch+1)
		}
		if !hasEvent(a.Events, gate.EventProbeExpired) {
			t.Fatalf("events = %+v, want probe_expired", a.Events)
		}
		if r := e.refuse(src); r.Reason != gate.ReasonProbeInFlight {
			t.Fatalf("second entrant after the lease: %+v, want probe_in_flight", r)
		}
		s := e.settle(src, old, gate.VerdictSuccess)
		if s.Effect != gate.EffectStale || s.Breaker.State != gate.HalfOpen || !s.Breaker.ProbeOut {
			t.Fatalf("late outcome of the expired probe: %+v, want stale, half_open, new probe still out", s)
		}
		if !hasEvent(s.Events, gate.EventStaleOutcome) {
			t.Fatalf("events = %+v, want stale_outcome", s.Events)
		}
	})

	t.Run("ProbeWithoutVerdictReleasesTheLease", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		e.open(src)
		e.clock.Advance(time.Second)
		p := e.grant(src)
		s := e.settle(src, p, gate.VerdictNone)
		if s.Effect != gate.EffectNoVerdict || s.Breaker.State != gate.HalfOpen || s.Breaker.ProbeOut {
			t.Fatalf("cancelled probe: %+v, want no_verdict, half_open, no probe out", s)
		}
		next := e.admit(0, src)
		if !next.Granted || !next.Permit.Probe || next.Permit.Epoch != p.Epoch+1 {
			t.Fatalf("next entrant: %+v, want the probe at once at epoch %d", next, p.Epoch+1)
		}
	})

	t.Run("GiveBackWithoutProbeOrEpochEndsTheProbe", func(t *testing.T) {
		// A shared backend gives back an Admit whose reply was lost without
		// a verdict and without knowing whether it took the probe, or at
		// which epoch: if its permit holds the probe, that ends the probe.
		e := newEnv(t, factory)
		src := Src("a")
		e.open(src)
		e.clock.Advance(time.Second)
		p := e.grant(src)
		s := e.settleReq(gate.SettleRequest{Source: src, PermitID: p.ID, Verdict: gate.VerdictNone, ActualTokens: -1})
		if !s.Released || s.Effect != gate.EffectNoVerdict || s.Breaker.State != gate.HalfOpen || s.Breaker.ProbeOut {
			t.Fatalf("give-back of the probe's permit: %+v, want released, no_verdict, half_open, no probe out", s)
		}
		next := e.admit(0, src)
		if !next.Granted || !next.Permit.Probe || next.Permit.Epoch != p.Epoch+1 {
			t.Fatalf("next entrant: %+v, want the probe at once at epoch %d", next, p.Epoch+1)
		}
		// Another permit's verdict-less give-back leaves the new probe out.
		if s := e.settleReq(gate.SettleRequest{Source: src, PermitID: "nobody", Verdict: gate.VerdictNone, ActualTokens: -1}); !s.Breaker.ProbeOut {
			t.Fatalf("give-back of a permit that is not the probe: %+v, want the probe still out", s)
		}
	})

	t.Run("ClosedEraOutcomesDuringOpenChangeNothing", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		late := []gate.Permit{e.grant(src), e.grant(src)}
		e.open(src)
		before := e.view(src).Breaker
		e.clock.Advance(100 * time.Millisecond)
		for i, v := range []gate.Verdict{gate.VerdictFailure, gate.VerdictSuccess} {
			s := e.settle(src, late[i], v)
			if s.Effect != gate.EffectStale {
				t.Fatalf("closed-era %v during OPEN: effect %v, want stale", v, s.Effect)
			}
			if s.Breaker.Reopens != before.Reopens || s.Breaker.RetryAfter != before.RetryAfter-100*time.Millisecond || s.Breaker.State != gate.Open {
				t.Fatalf("closed-era %v changed the opening: %+v (before %+v)", v, s.Breaker, before)
			}
		}
	})

	t.Run("ClosedEraSuccessDuringHalfOpenChangesNothing", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		late := e.grant(src)
		e.open(src)
		e.clock.Advance(time.Second)
		e.grant(src) // the probe
		s := e.settle(src, late, gate.VerdictSuccess)
		if s.Effect != gate.EffectStale || s.Breaker.State != gate.HalfOpen || !s.Breaker.ProbeOut {
			t.Fatalf("closed-era success during HALF_OPEN: %+v, want stale and the probe still out", s)
		}
	})

	t.Run("PeekNeverTakesTheProbe", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		e.open(src)
		e.clock.Advance(time.Second)
		for range 3 {
			v := e.view(src).Breaker
			if v.State != gate.HalfOpen || v.ProbeOut || v.Reason != gate.ReasonNone || v.RetryAfter != 0 {
				t.Fatalf("peek after the cooldown: %+v, want half_open, no probe out, admissible", v)
			}
		}
		if p := e.grant(src); !p.Probe {
			t.Fatalf("first entrant after peeks got no probe: %+v", p)
		}
	})
}
