package gatetest

import (
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

// rate makes a source's breaker trip on its failure rate only: half of at
// least 4 attempts in a second.
func rate(s *gate.Source) {
	s.Breaker.FailThreshold = 100
	s.Breaker.MinCalls = 4
	s.Breaker.FailRate = 0.5
	s.Breaker.Window = time.Second
}

func runBreaker(t *testing.T, factory Factory) {
	t.Run("ConsecutiveThresholdIsInclusive", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		e.attempt(src, gate.VerdictFailure)
		e.attempt(src, gate.VerdictFailure)
		e.attempt(src, gate.VerdictSuccess) // resets the streak
		e.attempt(src, gate.VerdictFailure)
		s := e.attempt(src, gate.VerdictFailure)
		if s.Breaker.State != gate.Closed {
			t.Fatalf("after 2 consecutive failures (threshold 3) state = %v", s.Breaker.State)
		}
		s = e.attempt(src, gate.VerdictFailure)
		if s.Breaker.State != gate.Open || s.Breaker.RetryAfter != time.Second {
			t.Fatalf("third consecutive failure: state %v retry_after %v, want open 1s", s.Breaker.State, s.Breaker.RetryAfter)
		}
		if len(s.Events) != 1 || s.Events[0].Kind != gate.EventTransition || s.Events[0].Cause != gate.CauseConsecutiveFailures ||
			s.Events[0].From != gate.Closed || s.Events[0].To != gate.Open || s.Events[0].Cooldown != time.Second {
			t.Fatalf("events = %+v, want one closed→open transition by consecutive_failures", s.Events)
		}
	})

	tests := []struct {
		name     string
		verdicts []gate.Verdict
		want     gate.State
	}{
		{"RateBelowMinCallsStaysClosed", []gate.Verdict{gate.VerdictFailure, gate.VerdictFailure, gate.VerdictFailure}, gate.Closed},
		{"RateJustBelowStaysClosed", []gate.Verdict{gate.VerdictSuccess, gate.VerdictSuccess, gate.VerdictFailure, gate.VerdictSuccess, gate.VerdictFailure}, gate.Closed},
		{"RateAtThresholdOpens", []gate.Verdict{gate.VerdictSuccess, gate.VerdictFailure, gate.VerdictSuccess, gate.VerdictFailure}, gate.Open},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, factory)
			src := Src("a", rate)
			for _, v := range tc.verdicts {
				e.attempt(src, v)
			}
			e.wantState(src, tc.want)
		})
	}

	t.Run("FailuresAgeOutOfTheWindow", func(t *testing.T) {
		// Window 1s in ten 100ms buckets; the clock starts on a bucket edge.
		for _, tc := range []struct {
			gap  time.Duration
			want gate.State
		}{
			{999 * time.Millisecond, gate.Open},    // still in the last bucket of the window
			{1000 * time.Millisecond, gate.Closed}, // aged out: only 2 calls remain, below min_calls
		} {
			t.Run(tc.gap.String(), func(t *testing.T) {
				e := newEnv(t, factory)
				src := Src("a", rate)
				e.attempt(src, gate.VerdictFailure)
				e.attempt(src, gate.VerdictFailure)
				e.clock.Advance(tc.gap)
				e.attempt(src, gate.VerdictSuccess)
				e.attempt(src, gate.VerdictFailure)
				e.wantState(src, tc.want)
			})
		}
	})

	t.Run("EscalatingCooldownsAreCapped", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a") // cooldown 1s, max 8s
		e.open(src)
		for i, want := range []time.Duration{2, 4, 8, 8, 8} {
			e.clock.Advance(e.view(src).Breaker.RetryAfter)
			probe := e.grant(src)
			if !probe.Probe {
				t.Fatalf("round %d: entrant after the cooldown got no probe", i)
			}
			s := e.settle(src, probe, gate.VerdictFailure)
			if s.Breaker.State != gate.Open || s.Breaker.RetryAfter != want*time.Second || s.Breaker.Reopens != i+2 {
				t.Fatalf("round %d: %v retry_after %v reopens %d, want open %v reopens %d",
					i, s.Breaker.State, s.Breaker.RetryAfter, s.Breaker.Reopens, want*time.Second, i+2)
			}
		}
	})

	t.Run("CooldownBoundary", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		e.open(src)
		e.clock.Advance(999 * time.Millisecond)
		if r := e.refuse(src); r.Reason != gate.ReasonCircuitOpen || r.RetryAfter != time.Millisecond {
			t.Fatalf("1ms before the end: %+v, want circuit_open 1ms", r)
		}
		e.clock.Advance(time.Millisecond)
		a := e.admit(0, src)
		if !a.Granted || !a.Permit.Probe {
			t.Fatalf("at the end of the cooldown: %+v, want the probe", a)
		}
		if !hasEvent(a.Events, gate.EventTransition) || !hasEvent(a.Events, gate.EventProbeLeased) {
			t.Fatalf("events = %+v, want open→half_open and probe_leased", a.Events)
		}
	})

	t.Run("SourceDeadOpensFromEveryState", func(t *testing.T) {
		dead := func(e *env, src *gate.Source, p gate.Permit, floor time.Duration) gate.Settlement {
			return e.settleReq(gate.SettleRequest{Source: src, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe, Verdict: gate.VerdictForceOpen, Floor: floor, ActualTokens: -1})
		}
		t.Run("Closed", func(t *testing.T) {
			e := newEnv(t, factory)
			src := Src("a")
			s := dead(e, src, e.grant(src), 0)
			if s.Breaker.State != gate.Open || s.Breaker.RetryAfter != time.Second || s.Events[0].Cause != gate.CauseSourceDead {
				t.Fatalf("%+v", s)
			}
		})
		t.Run("ClosedWithRetryAfterFloor", func(t *testing.T) {
			e := newEnv(t, factory)
			src := Src("a")
			s := dead(e, src, e.grant(src), 7*time.Second)
			if s.Breaker.RetryAfter != 7*time.Second {
				t.Fatalf("retry_after = %v, want the upstream's 7s", s.Breaker.RetryAfter)
			}
		})
		t.Run("OpenExtendsNeverShortens", func(t *testing.T) {
			e := newEnv(t, factory)
			src := Src("a")
			late := []gate.Permit{e.grant(src), e.grant(src)}
			e.open(src)
			e.clock.Advance(500 * time.Millisecond)
			s := dead(e, src, late[0], 0) // now+1s ends later than the 500ms left
			if s.Effect != gate.EffectApplied || s.Breaker.RetryAfter != time.Second || s.Breaker.Reopens != 1 {
				t.Fatalf("dead during OPEN: %+v, want applied, 1s left, reopens unchanged", s)
			}
			s = dead(e, src, late[1], 0) // same deadline: nothing to extend
			if s.Breaker.RetryAfter != time.Second || len(s.Events) != 0 {
				t.Fatalf("second dead during OPEN: %+v", s)
			}
		})
		t.Run("HalfOpenProbe", func(t *testing.T) {
			e := newEnv(t, factory)
			src := Src("a")
			e.open(src)
			e.clock.Advance(time.Second)
			s := dead(e, src, e.grant(src), 0)
			if s.Breaker.State != gate.Open || s.Breaker.RetryAfter != 2*time.Second || s.Breaker.Reopens != 2 {
				t.Fatalf("dead probe: %+v, want open for the next cooldown", s)
			}
		})
	})

	t.Run("OpenCauseSaysWhyTheBreakerIsOpen", func(t *testing.T) {
		cause := func(e *env, src *gate.Source) gate.OpenCause {
			e.t.Helper()
			return e.view(src).Breaker.Cause
		}
		dead := func(e *env, src *gate.Source) gate.Settlement {
			p := e.grant(src)
			return e.settleReq(gate.SettleRequest{Source: src, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe, Verdict: gate.VerdictForceOpen, ActualTokens: -1})
		}
		e := newEnv(t, factory)
		src := Src("a")
		if c := cause(e, src); c != gate.OpenCauseNone {
			t.Fatalf("closed breaker: cause %v, want none", c)
		}
		e.open(src)
		if c := cause(e, src); c != gate.OpenCauseFailures {
			t.Fatalf("opened by failures: cause %v", c)
		}
		e.clock.Advance(time.Second)
		if c := cause(e, src); c != gate.OpenCauseNone {
			t.Fatalf("cooldown over (reads half_open): cause %v, want none", c)
		}
		if s := dead(e, src); s.Breaker.Cause != gate.OpenCauseSourceDead {
			t.Fatalf("dead probe: settlement cause %v, want source_dead", s.Breaker.Cause)
		}
		if c := cause(e, src); c != gate.OpenCauseSourceDead {
			t.Fatalf("dead probe: cause %v, want source_dead", c)
		}
		e.clock.Advance(2 * time.Second)
		if s := e.settle(src, e.grant(src), gate.VerdictFailure); s.Breaker.Cause != gate.OpenCauseFailures {
			t.Fatalf("failed probe after a dead one: cause %v, want failures", s.Breaker.Cause)
		}

		t.Run("DeadExtendsFailureOpen", func(t *testing.T) {
			e := newEnv(t, factory)
			late := e.grant(src)
			e.open(src)
			s := e.settleReq(gate.SettleRequest{Source: src, PermitID: late.ID, Epoch: late.Epoch, Verdict: gate.VerdictForceOpen, Floor: 5 * time.Second, ActualTokens: -1})
			if s.Breaker.Cause != gate.OpenCauseSourceDead || cause(e, src) != gate.OpenCauseSourceDead {
				t.Fatalf("dead outcome extending a failure OPEN: cause %v, want source_dead", s.Breaker.Cause)
			}
		})
		t.Run("Forced", func(t *testing.T) {
			e := newEnv(t, factory)
			dead(e, src)
			if c := cause(e, src); c != gate.OpenCauseSourceDead {
				t.Fatalf("dead while closed: cause %v", c)
			}
			if r := e.override(src, gate.ActionForceOpen); r.View.Breaker.Cause != gate.OpenCauseForced {
				t.Fatalf("forced open: cause %v, want forced", r.View.Breaker.Cause)
			}
			e.override(src, gate.ActionClear)
			if c := cause(e, src); c != gate.OpenCauseSourceDead {
				t.Fatalf("override cleared: cause %v, want source_dead again", c)
			}
		})
	})

	t.Run("SettleIsIdempotent", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		p := e.grant(src)
		first := e.settle(src, p, gate.VerdictFailure)
		second := e.settle(src, p, gate.VerdictFailure)
		if !first.Released || first.Effect != gate.EffectApplied || second.Released || second.Effect != gate.EffectStale {
			t.Fatalf("first %+v second %+v", first, second)
		}
		if c := second.Breaker.Consecutive; c != 1 {
			t.Fatalf("consecutive failures = %d after one failure reported twice", c)
		}
	})
	runProbe(t, factory)
}
