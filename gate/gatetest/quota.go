package gatetest

import (
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
)

func runQuota(t *testing.T, factory Factory) {
	t.Run("ConcurrencySlots", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Limits.MaxConcurrency = 2 })
		p1, _ := e.grant(src), e.grant(src)
		if r := e.refuse(src); r.Reason != gate.ReasonRateLimited || r.RetryAfter != 0 {
			t.Fatalf("third attempt: %+v, want rate_limited 0", r)
		}
		if s := e.settle(src, p1, gate.VerdictSuccess); !s.Released {
			t.Fatalf("settle did not release: %+v", s)
		}
		e.grant(src)
		if q := e.view(src).Quota; q.InFlight != 2 {
			t.Fatalf("in flight = %d", q.InFlight)
		}
	})

	t.Run("LeaseExpiryFreesTheSlot", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Limits.MaxConcurrency = 1; s.Limits.Lease = 10 * time.Second })
		lost := e.grant(src)
		e.clock.Advance(10*time.Second - time.Millisecond)
		e.refuse(src)
		e.clock.Advance(time.Millisecond)
		e.grant(src)
		s := e.settle(src, lost, gate.VerdictFailure)
		if s.Released || s.Effect != gate.EffectStale || s.Breaker.Consecutive != 0 {
			t.Fatalf("outcome after the lease expired: %+v, want not released and stale", s)
		}
		if q := e.view(src).Quota; q.InFlight != 1 {
			t.Fatalf("the late outcome freed someone else's slot: in flight %d", q.InFlight)
		}
	})

	t.Run("PacerCeiling", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Limits.MaxConcurrency = 3 })
		paced := []gate.Candidate{{Source: src, Ceiling: 1}}
		if a := e.admitCandidates(0, paced); !a.Granted {
			t.Fatalf("first under ceiling 1: %+v", a)
		}
		a := e.admitCandidates(0, paced)
		if a.Granted || a.Rejections[0].Reason != gate.ReasonAdaptivePaced || a.Rejections[0].RetryAfter != 0 {
			t.Fatalf("second under ceiling 1: %+v, want adaptive_paced", a)
		}
		if a := e.admitCandidates(0, []gate.Candidate{{Source: src, Ceiling: 3}}); !a.Granted {
			t.Fatalf("at full ceiling: %+v", a)
		}
	})

	t.Run("RPMOverASlidingMinute", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Limits.RPM = 2 })
		e.settle(src, e.grant(src), gate.VerdictSuccess)
		e.clock.Advance(10 * time.Second)
		e.settle(src, e.grant(src), gate.VerdictSuccess)
		e.clock.Advance(5 * time.Second)
		if r := e.refuse(src); r.Reason != gate.ReasonRateLimited || r.RetryAfter != 45*time.Second {
			t.Fatalf("third in the minute: %+v, want rate_limited 45s", r)
		}
		e.clock.Advance(45*time.Second - time.Millisecond)
		e.refuse(src)
		e.clock.Advance(time.Millisecond)
		e.grant(src)
		if q := e.view(src).Quota; q.Requests != 2 {
			t.Fatalf("requests in the minute = %d, want 2", q.Requests)
		}
	})

	t.Run("TPMEstimateThenActual", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Limits.TPM = 100 })
		first := e.admit(60, src)
		if !first.Granted {
			t.Fatalf("%+v", first)
		}
		e.clock.Advance(time.Second)
		r := e.admit(60, src)
		if r.Granted || r.Rejections[0].Reason != gate.ReasonRateLimited || r.Rejections[0].RetryAfter != 59*time.Second {
			t.Fatalf("over TPM: %+v, want rate_limited 59s", r)
		}
		e.settleReq(gate.SettleRequest{Source: src, PermitID: first.Permit.ID, Epoch: first.Permit.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: 10})
		if a := e.admit(60, src); !a.Granted {
			t.Fatalf("after settling to 10 actual tokens: %+v", a)
		}
		if q := e.view(src).Quota; q.Tokens != 70 {
			t.Fatalf("tokens in the minute = %d, want 70", q.Tokens)
		}
	})

	t.Run("AllOrNothing", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Limits.TPM = 100; s.Limits.RPM = 10; s.Limits.MaxConcurrency = 5 })
		e.admit(90, src)
		e.admit(20, src) // refused by TPM
		q := e.view(src).Quota
		if q.InFlight != 1 || q.Requests != 1 || q.Tokens != 90 {
			t.Fatalf("a TPM refusal held something: %+v", q)
		}
	})

	t.Run("BreakerRefusalGivesTheQuotaBack", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a", func(s *gate.Source) { s.Limits.RPM = 100 })
		e.open(src)
		before := e.view(src).Quota
		if r := e.refuse(src); r.Reason != gate.ReasonCircuitOpen {
			t.Fatalf("%+v", r)
		}
		if after := e.view(src).Quota; after != before {
			t.Fatalf("quota after a breaker refusal %+v, before %+v", after, before)
		}
	})

	t.Run("WalkOrder", func(t *testing.T) {
		e := newEnv(t, factory)
		a := Src("a", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
		b, c := Src("b"), Src("c")
		e.grant(a)
		e.open(b)
		adm := e.admit(0, a, b, c)
		if !adm.Granted || adm.Permit.Source != "c" {
			t.Fatalf("%+v, want c granted", adm)
		}
		if len(adm.Rejections) != 2 || adm.Rejections[0].Source != "a" || adm.Rejections[0].Reason != gate.ReasonRateLimited ||
			adm.Rejections[1].Source != "b" || adm.Rejections[1].Reason != gate.ReasonCircuitOpen {
			t.Fatalf("rejections = %+v", adm.Rejections)
		}
		if q := e.view(b).Quota; q.InFlight != 0 {
			t.Fatalf("b holds %d slots after refusing", q.InFlight)
		}
	})

	t.Run("Progress", func(t *testing.T) {
		e := newEnv(t, factory)
		src := Src("a")
		if p := e.peek(src).ProgressAge; p != gate.Never {
			t.Fatalf("progress age of a new scope = %v, want Never", p)
		}
		e.attempt(src, gate.VerdictFailure)
		if p := e.peek(src).ProgressAge; p != gate.Never {
			t.Fatalf("a failure made progress: %v", p)
		}
		e.attempt(src, gate.VerdictSuccess)
		e.clock.Advance(3 * time.Second)
		if p := e.peek(src).ProgressAge; p != 3*time.Second {
			t.Fatalf("progress age = %v, want 3s", p)
		}
		if a := e.admit(0, src); a.ProgressAge != 3*time.Second {
			t.Fatalf("admission progress age = %v", a.ProgressAge)
		}
	})
}
