package gatetest

import (
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// runRetryAfter checks the retry_after table of docs/design.md at every exit of a backend:
// admission refusals, settlements and peeks.
func runRetryAfter(t *testing.T, factory Factory) {
	t.Run("Closed", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		a := e.admit(0, src)
		if !a.Granted || len(a.Rejections) != 0 {
			t.Fatalf("closed: %+v", a)
		}
		if v := e.view(src).Breaker; v.RetryAfter != 0 || v.Reason != gate.ReasonNone {
			t.Fatalf("peek closed: %+v", v)
		}
		if s := e.settle(src, a.Permit, gate.VerdictSuccess); s.Breaker.RetryAfter != 0 {
			t.Fatalf("settle closed: %+v", s.Breaker)
		}
	})

	t.Run("OpenIsTheRemainingCooldownEverywhere", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Breaker.Cooldown = 60 * time.Second; s.Breaker.MaxCooldown = 300 * time.Second })
		e.open(src)
		openedAt := e.clock.Now()
		prev := time.Duration(1 << 62)
		for _, step := range []time.Duration{0, time.Millisecond, 10 * time.Second, 49*time.Second + 998*time.Millisecond} {
			e.clock.Advance(step)
			peek := e.view(src).Breaker
			r := e.refuse(src)
			if r.Reason != gate.ReasonCircuitOpen || r.RetryAfter != peek.RetryAfter || peek.Reason != gate.ReasonCircuitOpen {
				t.Fatalf("refusal %+v and peek %+v disagree", r, peek)
			}
			want := 60*time.Second - e.clock.Now().Sub(openedAt)
			if r.RetryAfter != want || r.RetryAfter > prev {
				t.Fatalf("retry_after = %v, want the remaining %v (never growing, previous %v)", r.RetryAfter, want, prev)
			}
			prev = r.RetryAfter
		}
	})

	t.Run("RoundedUpToTheMillisecond", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		e.open(src)
		e.clock.Advance(999*time.Millisecond + 400*time.Microsecond)
		if r := e.refuse(src); r.RetryAfter != time.Millisecond {
			t.Fatalf("0.6ms before the end retry_after = %v, want 1ms (never 0 while refused)", r.RetryAfter)
		}
		e.clock.Advance(600 * time.Microsecond)
		if a := e.admit(0, src); !a.Granted {
			t.Fatalf("waiting exactly the rounded retry_after was refused: %+v", a.Rejections)
		}
	})

	t.Run("HalfOpenRefusalIsZero", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Breaker.ProbeTTL = 600 * time.Second })
		e.open(src)
		e.clock.Advance(time.Second)
		probe := e.grant(src)
		r := e.refuse(src)
		if r.Reason != gate.ReasonProbeInFlight || r.RetryAfter != 0 {
			t.Fatalf("refused during the probe: %+v, want probe_in_flight 0 (the lease is no retry hint)", r)
		}
		v := e.view(src).Breaker
		if v.RetryAfter != 0 || v.Reason != gate.ReasonProbeInFlight || !v.ProbeOut || v.ProbeLeft != 600*time.Second {
			t.Fatalf("peek during the probe: %+v", v)
		}
		// A stale outcome settled during HALF_OPEN answers 0 too.
		stale := e.settle(src, gate.Permit{ID: "unknown", Epoch: probe.Epoch - 1}, gate.VerdictFailure)
		if stale.Effect != gate.EffectStale || stale.Breaker.RetryAfter != 0 {
			t.Fatalf("stale settle during HALF_OPEN: %+v", stale)
		}
	})

	t.Run("MinimumOverSources", func(t *testing.T) {
		e := newEnv(t, factory)
		a, b := Src("a"), Src("b", func(s *gate.Source) { s.Breaker.Cooldown = 4 * time.Second })
		e.open(a)
		e.open(b)
		e.clock.Advance(300 * time.Millisecond)
		adm := e.admit(0, a, b)
		if adm.Granted || len(adm.Rejections) != 2 {
			t.Fatalf("%+v", adm)
		}
		if adm.Rejections[0].RetryAfter != 700*time.Millisecond || adm.Rejections[1].RetryAfter != 3700*time.Millisecond {
			t.Fatalf("rejections %+v", adm.Rejections)
		}
	})
}
