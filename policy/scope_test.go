package policy_test

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/policy"
)

// The reference's incident, as a regression test: a HALF_OPEN refusal must
// not write the probe lease into the cooldown memo.
func TestMemoIsNeverPolluted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
circuit_open: fail_fast
breaker: {fail_threshold: 1, cooldown: 60s, max_cooldown: 300s, probe_ttl: 600s}
sources:
  - {name: only, timeout: 300s}
`)
		fail(t, s, policy.Transient) // opens
		time.Sleep(60 * time.Second)

		a, b := newCall(s), newCall(s)
		probe := grant(t, s, a)
		if !probe.Permit.Probe {
			t.Fatalf("A did not get the probe: %+v", probe)
		}
		refused := pick(t, s, b).NoRunnable
		if refused == nil || len(refused.Sources) != 1 || refused.Sources[0].Reason != gate.ReasonProbeInFlight ||
			refused.Sources[0].RetryAfter != 0 || refused.GateRejections != 1 {
			t.Fatalf("B's refusal: %+v, want probe_in_flight with retry_after 0", refused)
		}
		if r := record(t, s, a, probe, policy.Success); !r.Next.Done || r.Breaker.State != gate.Closed {
			t.Fatalf("probe success: %+v", r)
		}
		if g := pick(t, s, b).Grant; g == nil {
			t.Fatal("B's next Pick was refused after the probe closed the breaker: the memo kept the probe lease")
		}
		d, err := s.Describe(ctx(t))
		if err != nil || d.Sources[0].Memo != 0 {
			t.Fatalf("memo after the close: %+v %v", d.Sources[0], err)
		}
	})
}

// The OnNoRunnable matrix: policies × kinds of refusal.
func TestOnNoRunnableMatrix(t *testing.T) {
	const poll = 100 * time.Millisecond // jitter = 75ms with rand 0.5
	states := []struct {
		name  string
		setup func(t *testing.T, s *policy.Scope)
		// circuit: every source refused by its breaker; hint is then the
		// minimum retry_after over the sources.
		circuit bool
		hint    time.Duration
		want    []gate.Reason
		// slots is each source's max_concurrency: a probe holds a slot, so a
		// full pool would refuse by quota before the breaker is asked.
		slots string
	}{
		{"AllOpen", func(t *testing.T, s *policy.Scope) {
			fail(t, s, policy.Transient) // a: 10s
			fail(t, s, policy.Transient) // b: 20s
			time.Sleep(time.Second)
		}, true, 9 * time.Second, []gate.Reason{gate.ReasonCooldown, gate.ReasonCooldown}, "1"},
		{"AllHalfOpen", func(t *testing.T, s *policy.Scope) {
			fail(t, s, policy.SourceDead)
			fail(t, s, policy.SourceDead)
			time.Sleep(20 * time.Second)
			grant(t, s, newCall(s)) // a's probe
			grant(t, s, newCall(s)) // b's probe
		}, true, 0, []gate.Reason{gate.ReasonProbeInFlight, gate.ReasonProbeInFlight}, "2"},
		{"MixedBreakerAndQuota", func(t *testing.T, s *policy.Scope) {
			fail(t, s, policy.SourceDead) // a opens
			grant(t, s, newCall(s))       // b's only slot, held
		}, false, 0, []gate.Reason{gate.ReasonCooldown, gate.ReasonRateLimited}, "1"},
		{"QuotaOnly", func(t *testing.T, s *policy.Scope) {
			grant(t, s, newCall(s))
			grant(t, s, newCall(s))
		}, false, 0, []gate.Reason{gate.ReasonRateLimited, gate.ReasonRateLimited}, "1"},
	}
	policies := []struct{ circuitOpen, quotaFull string }{
		{"fail_fast", "wait"}, {"fail_fast", "fail_fast"}, {"wait", "wait"}, {"wait", "fail_fast"},
	}
	for _, st := range states {
		for _, pol := range policies {
			t.Run(st.name+"/circuit_open="+pol.circuitOpen+"/quota_full="+pol.quotaFull, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					s, _ := newScope(t, `
circuit_open: `+pol.circuitOpen+`
quota_full: `+pol.quotaFull+`
backpressure: {stall_window: 300s, poll_interval: 100ms}
breaker: {fail_threshold: 1}
sources:
  - {name: a, priority: 0, max_concurrency: `+st.slots+`, breaker: {cooldown: 10s, max_cooldown: 10s}}
  - {name: b, priority: 1, max_concurrency: `+st.slots+`, breaker: {cooldown: 20s, max_cooldown: 20s}}
`)
					st.setup(t, s)
					c := newCall(s)
					nr := pick(t, s, c).NoRunnable
					if nr == nil || len(nr.Sources) != 2 {
						t.Fatalf("want a refusal of both sources, got %+v", nr)
					}
					for i, r := range nr.Sources {
						if r.Reason != st.want[i] {
							t.Fatalf("reasons %s, want %v", reasons(nr.Sources), st.want)
						}
					}
					if wantGate := map[bool]int{true: 2, false: 1}[st.circuit]; st.name == "QuotaOnly" && nr.GateRejections != 0 ||
						st.name != "QuotaOnly" && nr.GateRejections != wantGate {
						t.Fatalf("gate_rejections = %d", nr.GateRejections)
					}
					d, err := s.OnNoRunnable(ctx(t), c)
					if err != nil {
						t.Fatal(err)
					}
					switch {
					case st.circuit && pol.circuitOpen == "fail_fast":
						if d.Failure == nil || d.Failure.Reason != policy.FailCircuitOpen || d.Failure.RetryAfter != st.hint {
							t.Fatalf("decision %+v, want circuit_open with retry_after %v", d, st.hint)
						}
					case !st.circuit && pol.quotaFull == "fail_fast":
						if d.Failure == nil || d.Failure.Reason != policy.FailQuotaExhausted || len(d.Failure.Sources) != 2 {
							t.Fatalf("decision %+v, want quota_exhausted with both reasons", d)
						}
					default:
						// A wait, never a quota_exhausted for a breaker wait:
						// until the cooldown ends plus jitter when every source
						// is OPEN; else (no certain time) the caller is held
						// until something changes — here nothing does, so the
						// whole stall budget plus one poll interval.
						want, uncertain := 300*time.Second+poll, true
						if st.circuit && st.hint > 0 {
							want, uncertain = st.hint+75*time.Millisecond, false
						}
						if st.name == "MixedBreakerAndQuota" {
							// a's cooldown ends at 10s: the scope's poller sees
							// it admissible within one poll interval.
							if !d.Woken || d.Slept < 10*time.Second || d.Slept > 10*time.Second+poll {
								t.Fatalf("decision %+v, want woken when a's cooldown ends", d)
							}
							return
						}
						if d.Failure != nil || d.Slept != want || d.Sleep != 0 || d.Uncertain != uncertain {
							t.Fatalf("decision %+v, want a wait of %v", d, want)
						}
					}
				})
			})
		}
	}
}

func TestWaitIsClampedToTheStallBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
circuit_open: wait
backpressure: {stall_window: 5s, poll_interval: 100ms}
breaker: {fail_threshold: 1, cooldown: 60s}
sources: [{name: only}]
`)
		fail(t, s, policy.Transient)
		c := newCall(s)
		time.Sleep(2 * time.Second) // the call has been waiting 2s
		pick(t, s, c)
		d, err := s.OnNoRunnable(ctx(t), c)
		if err != nil {
			t.Fatal(err)
		}
		if want := 3*time.Second + 100*time.Millisecond; d.Failure != nil || d.Slept != want {
			t.Fatalf("decision %+v, want a wait of the 3s left plus one poll interval (%v)", d, want)
		}
		pick(t, s, c)
		d, _ = s.OnNoRunnable(ctx(t), c)
		f := wantFailure(t, policy.Action{Failure: d.Failure}, policy.FailStalled)
		// The Pick was refused by the cooldown memo; the answer says what
		// its own read found: the breaker OPEN, with the cooldown left now.
		if len(f.Sources) != 1 || f.Sources[0].Reason != gate.ReasonCircuitOpen || f.Sources[0].RetryAfter != f.RetryAfter {
			t.Fatalf("stalled failure reasons %s, retry_after %v", reasons(f.Sources), f.RetryAfter)
		}
	})
}

// An answer carries the values of the one read it was decided on: an
// OnNoRunnable failure some time after its Pick says each source's
// retry_after as it is now, the same as the failure's own, not the Pick's.
func TestFailureCarriesTheCurrentValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
circuit_open: fail_fast
breaker: {fail_threshold: 1, cooldown: 10s}
sources: [{name: a}, {name: b, breaker: {cooldown: 20s}}]
`)
		fail(t, s, policy.Transient)
		fail(t, s, policy.Transient) // a and b OPEN, for 10s and 20s
		c := newCall(s)
		refused := pick(t, s, c).NoRunnable
		if refused == nil || len(refused.Sources) != 2 {
			t.Fatalf("Pick: %+v, want both sources refused", refused)
		}
		time.Sleep(3 * time.Second)
		d, err := s.OnNoRunnable(ctx(t), c)
		if err != nil {
			t.Fatal(err)
		}
		f := wantFailure(t, policy.Action{Failure: d.Failure}, policy.FailCircuitOpen)
		want := map[string]time.Duration{"a": 7 * time.Second, "b": 17 * time.Second}
		for _, r := range f.Sources {
			if r.Reason != gate.ReasonCircuitOpen || r.RetryAfter != want[r.Source] {
				t.Errorf("%s: %v %v; want circuit_open with the cooldown left now, %v", r.Source, r.Reason, r.RetryAfter, want[r.Source])
			}
		}
		if f.RetryAfter != want["a"] {
			t.Errorf("failure retry_after %v; want the least of its sources', %v", f.RetryAfter, want["a"])
		}
	})
}

func TestCircuitWaitSleepsThroughTheCooldownThenProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
circuit_open: wait
backpressure: {stall_window: 300s, poll_interval: 50ms}
breaker: {fail_threshold: 1, cooldown: 60s}
sources: [{name: only}]
`)
		fail(t, s, policy.Transient)
		res := drive(t, s, newCall(s), always(policy.Success))
		if !res.action.Done || len(res.attempts) != 1 {
			t.Fatalf("call ended %v after %v attempts", res.action, res.attempts)
		}
		// One wait until the cooldown ends plus jitter: no polling through it.
		if want := 60*time.Second + 38*time.Millisecond; res.elapsed != want {
			t.Fatalf("elapsed %v, want %v", res.elapsed, want)
		}
	})
}

func TestForceOpenUnderWaitEndsWithTheFirstBudgetToRunOut(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxAttempts string
		want        policy.FailureReason
	}{
		{"RetryBudgetFirst", "3", policy.FailRetryExhausted},
		{"StallBudgetFirst", "100", policy.FailStalled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, _ := newScope(t, `
circuit_open: wait
source_dead: wait
max_attempts: `+tc.maxAttempts+`
backoff: {base: 1s, max: 4s}
backpressure: {stall_window: 60s, poll_interval: 50ms}
breaker: {cooldown: 5s, max_cooldown: 20s}
sources: [{name: only}]
`)
				res := drive(t, s, newCall(s), always(policy.SourceDead))
				wantFailure(t, res.action, tc.want)
				if tc.want == policy.FailRetryExhausted && len(res.attempts) != 3 {
					t.Fatalf("attempts = %d, want 3 (a probe is a real attempt)", len(res.attempts))
				}
				// Attempts take no time here, so the call's wall time is its
				// waiting: never more than stall_window + poll_interval.
				if limit := 60*time.Second + 50*time.Millisecond; res.elapsed > limit {
					t.Fatalf("wall time %v exceeds stall_window + poll_interval (%v)", res.elapsed, limit)
				}
			})
		})
	}
}

func TestSourceDeadFailsFast(t *testing.T) {
	const scope = `
circuit_open: wait
backpressure: {stall_window: 300s, poll_interval: 100ms}
breaker: {fail_threshold: 1}
sources:
  - {name: a, priority: 0, breaker: {cooldown: 10s, max_cooldown: 10s}}
  - {name: b, priority: 1, breaker: {cooldown: 20s, max_cooldown: 20s}}
`
	decide := func(t *testing.T, s *policy.Scope) policy.Decision {
		t.Helper()
		c := newCall(s)
		if nr := pick(t, s, c).NoRunnable; nr == nil {
			t.Fatal("want every source refused")
		}
		d, err := s.OnNoRunnable(ctx(t), c)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	t.Run("EveryBreakerDead", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, scope)
			fail(t, s, policy.SourceDead) // a: 10s
			fail(t, s, policy.SourceDead) // b: 20s
			time.Sleep(time.Second)
			start := time.Now()
			d := decide(t, s)
			if d.Failure == nil || d.Failure.Reason != policy.FailSourceDead || d.Failure.RetryAfter != 9*time.Second || len(d.Failure.Sources) != 2 {
				t.Fatalf("decision %+v, want source_dead with the 9s left of a's cooldown, whatever circuit_open says", d)
			}
			if waited := time.Since(start); waited != 0 {
				t.Fatalf("failing took %v of the caller's time, want none", waited)
			}
			// The next call fails the same way: the memo refuses at once.
			if d := decide(t, s); d.Failure == nil || d.Failure.Reason != policy.FailSourceDead {
				t.Fatalf("next call: %+v, want source_dead", d)
			}
		})
	})
	t.Run("OneMerelyCoolingDown", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, scope)
			fail(t, s, policy.SourceDead) // a: 10s
			fail(t, s, policy.Transient)  // b: 20s
			if d := decide(t, s); d.Failure != nil || d.Slept != 10*time.Second+75*time.Millisecond {
				t.Fatalf("decision %+v, want circuit_open's wait until a's cooldown ends", d)
			}
		})
	})
	t.Run("ForcedOpenIsNotDead", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, "source_dead: fail_fast\n"+scope)
			fail(t, s, policy.SourceDead)
			fail(t, s, policy.SourceDead)
			if _, err := s.Override(ctx(t), "b", gate.ActionForceOpen, "op", "maintenance"); err != nil {
				t.Fatal(err)
			}
			if d := decide(t, s); d.Failure != nil {
				t.Fatalf("decision %+v, want circuit_open's wait: b is forced open, not dead", d)
			}
		})
	})
	t.Run("SourceDeadWait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, "source_dead: wait\n"+scope)
			fail(t, s, policy.SourceDead)
			fail(t, s, policy.SourceDead)
			if d := decide(t, s); d.Failure != nil || d.Slept != 10*time.Second+75*time.Millisecond {
				t.Fatalf("decision %+v, want circuit_open's wait as before", d)
			}
		})
	})
}

// A SOURCE_DEAD outcome that leaves every source of the scope refused as
// dead ends the call in RecordOutcome's answer (source_dead, with the
// cooldown left), after that one attempt and without a backoff; while some
// source is not dead, or with source_dead: wait, the call retries as the
// outcome table says.
func TestSourceDeadEndsAtRecordOutcome(t *testing.T) {
	const two = `
circuit_open: wait
backoff: {base: 1s, max: 1s}
backpressure: {stall_window: 300s, poll_interval: 100ms}
breaker: {fail_threshold: 1}
sources:
  - {name: a, priority: 0, breaker: {cooldown: 10s, max_cooldown: 10s}}
  - {name: b, priority: 1, breaker: {cooldown: 20s, max_cooldown: 20s}}
`
	t.Run("OneSource", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, "circuit_open: wait\nbreaker: {cooldown: 60s, max_cooldown: 60s}\nsources: [{name: only}]\n")
			c := newCall(s)
			rec := record(t, s, c, grant(t, s, c), policy.SourceDead)
			f := rec.Next.Failure
			if f == nil || f.Reason != policy.FailSourceDead || f.RetryAfter != 60*time.Second ||
				len(f.Sources) != 1 || f.Sources[0].Source != "only" || f.Sources[0].Reason != gate.ReasonCircuitOpen {
				t.Fatalf("RecordOutcome answered %+v, want Failure source_dead with the 60s cooldown left", rec.Next)
			}
			if _, err := s.OnNoRunnable(ctx(t), c); !errors.Is(err, policy.ErrCallEnded) {
				t.Fatalf("OnNoRunnable after the failure: %v, want the call ended", err)
			}
		})
	})
	t.Run("TheLastLiveSource", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, two)
			res := drive(t, s, newCall(s), always(policy.SourceDead))
			f := wantFailure(t, res.action, policy.FailSourceDead)
			if len(res.attempts) != 2 || len(res.retries) != 1 || res.elapsed != res.retries[0] {
				t.Fatalf("attempts %v, retries %v, elapsed %v: want a, then b, ended by b's outcome after one backoff", res.attempts, res.retries, res.elapsed)
			}
			if want := 10*time.Second - res.elapsed; f.RetryAfter != want || len(f.Sources) != 2 {
				t.Fatalf("failure %+v, want a's %v cooldown left and both sources' refusals", f, want)
			}
		})
	})
	t.Run("AnotherMerelyCoolingDown", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, two)
			fail(t, s, policy.Transient) // a opens on failures
			c := newCall(s)
			g := grant(t, s, c)
			if g.Source.Name != "b" {
				t.Fatalf("granted %s, want b", g.Source.Name)
			}
			if rec := record(t, s, c, g, policy.SourceDead); rec.Next.Retry == nil {
				t.Fatalf("RecordOutcome answered %+v, want a retry: a is cooling down, not dead", rec.Next)
			}
		})
	})
	t.Run("SourceDeadWait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, "source_dead: wait\n"+two)
			fail(t, s, policy.SourceDead) // a
			c := newCall(s)
			if rec := record(t, s, c, grant(t, s, c), policy.SourceDead); rec.Next.Retry == nil {
				t.Fatalf("RecordOutcome answered %+v, want a retry as before", rec.Next)
			}
		})
	})
}

func TestBudgets(t *testing.T) {
	t.Run("OneLongAttemptIsNotStalling", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
backpressure: {stall_window: 10s}
backoff: {base: 1s, max: 1s}
sources: [{name: only}]
`)
			n := 0
			res := drive(t, s, newCall(s), func(*policy.Grant) reply {
				n++
				if n == 1 {
					return reply{outcome: policy.Transient, latency: 30 * time.Second}
				}
				return reply{outcome: policy.Success}
			})
			if !res.action.Done || len(res.attempts) != 2 {
				t.Fatalf("%v after %d attempts; the retry budget must stay usable", res.action, len(res.attempts))
			}
		})
	})

	t.Run("RateLimitStormEndsStalledWithoutChargingAttempts", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
max_attempts: 2
backoff: {base: 100ms, max: 100ms}
backpressure: {stall_window: 10s}
sources: [{name: only}]
`)
			c := newCall(s)
			res := drive(t, s, c, func(*policy.Grant) reply {
				return reply{outcome: policy.RateLimited, latency: 2 * time.Second, retryAfter: time.Second}
			})
			wantFailure(t, res.action, policy.FailStalled)
			st := c.Stats(time.Now())
			if st.Charged != 0 || len(res.attempts) < 3 {
				t.Fatalf("charged %d of max_attempts over %d attempts", st.Charged, len(res.attempts))
			}
			for _, r := range res.retries {
				if r < time.Second {
					t.Fatalf("retried after %v, before the upstream's Retry-After", r)
				}
			}
			// 429 attempts are refunded to the stall budget: the call stalled
			// on its first check past 10s of 429 attempts and backoffs.
			if st.Productive != 0 || st.Waiting <= 10*time.Second || st.Waiting > 13*time.Second {
				t.Fatalf("stats %+v", st)
			}
		})
	})

	t.Run("PureWaitingAccumulatesToStalled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
backpressure: {stall_window: 10s, poll_interval: 200ms}
sources: [{name: only, max_concurrency: 1, timeout: 1m}]
`)
			grant(t, s, newCall(s)) // holds the only slot
			c := newCall(s)
			res := drive(t, s, c, always(policy.Success))
			f := wantFailure(t, res.action, policy.FailStalled)
			if len(f.Sources) != 1 || f.Sources[0].Reason != gate.ReasonRateLimited {
				t.Fatalf("reasons %s", reasons(f.Sources))
			}
			if res.elapsed <= 10*time.Second || res.elapsed > 10*time.Second+200*time.Millisecond {
				t.Fatalf("stalled after %v, want just past the 10s stall window", res.elapsed)
			}
		})
	})

	t.Run("ConcurrentCallsKeepTheirOwnClocks", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
backpressure: {stall_window: 300s}
backoff: {base: 1s, max: 1s}
sources: [{name: only, max_concurrency: 10}]
`)
			slow, quick := newCall(s), newCall(s)
			var wg sync.WaitGroup
			wg.Go(func() {
				drive(t, s, slow, func(*policy.Grant) reply { return reply{outcome: policy.Success, latency: 20 * time.Second} })
			})
			wg.Go(func() {
				time.Sleep(5 * time.Second)
				drive(t, s, quick, func(*policy.Grant) reply { return reply{outcome: policy.RateLimited, latency: time.Second} })
			})
			wg.Wait()
			now := time.Now()
			a, b := slow.Stats(now), quick.Stats(now)
			if a.Productive != 20*time.Second || a.Waiting != now.Sub(slow.Started)-20*time.Second {
				t.Fatalf("slow call %+v", a)
			}
			if b.Productive != 0 || b.Charged != 0 {
				t.Fatalf("quick call %+v: its 429s must not be productive", b)
			}
		})
	})
}

func TestMisuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `sources: [{name: only, tpm: 100}]`)
		c := newCall(s)
		if _, err := s.OnNoRunnable(ctx(t), c); !errors.Is(err, policy.ErrNoRefusal) {
			t.Fatalf("OnNoRunnable before a refusal: %v", err)
		}
		g := grant(t, s, c)
		if _, err := s.Pick(ctx(t), c); !errors.Is(err, policy.ErrPermitOutstanding) {
			t.Fatalf("Pick while holding a permit: %v", err)
		}
		if _, err := s.RecordOutcome(ctx(t), c, policy.Attempt{PermitID: "nope", Outcome: policy.Success}); !errors.Is(err, policy.ErrPermitNotOfCall) {
			t.Fatalf("foreign permit: %v", err)
		}
		first := record(t, s, c, g, policy.Success)
		again := record(t, s, c, g, policy.Transient)
		if !again.Next.Done || again.Effect != first.Effect {
			t.Fatalf("repeated report answered %+v, want the first answer %+v", again, first)
		}
		if _, err := s.Pick(ctx(t), c); !errors.Is(err, policy.ErrCallEnded) {
			t.Fatalf("Pick after Done: %v", err)
		}
		big := policy.NewCall("big", "s", 101, time.Time{}, time.Now())
		if _, err := s.Pick(ctx(t), big); !errors.Is(err, policy.ErrEstimateTooLarge) {
			t.Fatalf("estimate above every tpm: %v", err)
		}
		if _, err := s.Override(ctx(t), "nope", gate.ActionForceOpen, "me", "test"); !errors.Is(err, policy.ErrUnknownSource) {
			t.Fatalf("unknown source: %v", err)
		}
	})
}

func TestDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
circuit_open: wait
breaker: {fail_threshold: 1, cooldown: 60s}
sources: [{name: only}]
`)
		fail(t, s, policy.Transient)
		c := policy.NewCall("c", "s", 0, time.Now().Add(10*time.Second), time.Now())
		pick(t, s, c)
		d, err := s.OnNoRunnable(ctx(t), c)
		if err != nil {
			t.Fatal(err)
		}
		// The cooldown ends after the deadline: fail now, with the certain time.
		if d.Failure == nil || d.Failure.Reason != policy.FailDeadlineExceeded || d.Failure.RetryAfter != 60*time.Second || d.Slept != 0 {
			t.Fatalf("decision %+v", d)
		}
	})
}
