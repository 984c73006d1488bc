package redisgate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/gate/redisgate"
)

// The admit's and the settle's early exits (admit.lua, settle.lua) take a
// batch's common op (one candidate, a CLOSED breaker without override, a
// slot free, no line to join; a success of this epoch) without the walk.
// They run in a batch whose cache holds the source's state hash (the
// batch's first op of the source walks, and reads it), so each case here
// runs its ops as one batch, behind a stale settle that loads the hash (the
// exits) and without it (the first op walks), the same ops one at a time
// (never an early exit), and on the memory backend, and wants the same
// answers from all three and the same stored hashes from the two on Redis.
// The cases stand where an exit's conditions are just met or just not.

// fastCase is a source, what is done to it one op at a time first (setup),
// and the ops then run together; an op answers a string to compare.
type fastCase struct {
	name  string
	src   func(s *gate.Source)
	setup func(f *fastRun)
	ops   []func(f *fastRun) string
}

// fastRun is one run of a case: on a backend, in a scope, with the permits
// it was granted (a batched run settles the permits its sequential twin
// was granted, whose ids and epochs are the same: its ops cannot wait for
// each other's answers).
type fastRun struct {
	t     *testing.T
	ctx   context.Context
	be    gate.Backend
	clock *gatetest.Clock
	scope string
	src   *gate.Source
	ps    map[string]gate.Permit
	keep  bool // record granted permits in ps
}

func (f *fastRun) admitW(id string, ceiling int, w *gate.Waiter) string {
	req := admitReq(f.scope, id, f.src)
	if ceiling > 0 {
		req.Candidates[0].Ceiling = ceiling
	}
	req.Tokens = 7
	req.Line = w
	a, err := f.be.Admit(f.ctx, req)
	if a.Granted && f.keep {
		f.ps[id] = a.Permit
	}
	a.ProgressAge = 0
	return fmt.Sprintf("%+v %v", a, err)
}

func (f *fastRun) admit(id string) string { return f.admitW(id, 0, nil) }

func (f *fastRun) admitPermit(id string) gate.Permit {
	f.admit(id)
	return f.ps[id]
}

func (f *fastRun) settleA(id string, v gate.Verdict, actual int64, line bool) string {
	p, ok := f.ps[id]
	if !ok {
		p = gate.Permit{ID: id}
	}
	req := settleReq(f.scope, f.src, p, v)
	req.ActualTokens = actual
	req.Progress = true
	if line {
		req.Line = &gate.LineHandoff{Lease: time.Minute}
	}
	s, err := f.be.Settle(f.ctx, req)
	s.ProgressAge = 0
	return fmt.Sprintf("%+v %v", s, err)
}

func (f *fastRun) settle(id string, v gate.Verdict) string { return f.settleA(id, v, -1, false) }

func fastWaiter(id string, places map[string]string) *gate.Waiter {
	return &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Minute, Places: places}
}

func TestEarlyExitsAnswerAsTheWalk(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "warm")
	b.KeepArrivalOrder() // compared with the ops one at a time in arrival order
	mem := inmem.New(clock.Now)
	two := func(s *gate.Source) {
		s.Limits = gate.Limits{MaxConcurrency: 2, Lease: 10 * time.Second}
		s.Breaker.FailThreshold, s.Breaker.Cooldown, s.Breaker.MaxCooldown, s.Breaker.ProbeTTL = 2, time.Second, time.Minute, 5*time.Second
	}
	adm := func(id string) func(f *fastRun) string { return func(f *fastRun) string { return f.admit(id) } }
	set := func(id string, v gate.Verdict) func(f *fastRun) string {
		return func(f *fastRun) string { return f.settle(id, v) }
	}
	// after moves the clock by d before op (its own time: a batch's ops
	// carry theirs under a test clock).
	after := func(d time.Duration, op func(f *fastRun) string) func(f *fastRun) string {
		return func(f *fastRun) string {
			f.clock.Advance(d)
			return op(f)
		}
	}
	cases := []fastCase{
		{name: "common", src: two, ops: []func(*fastRun) string{
			adm("a1"), set("a1", gate.VerdictSuccess), adm("a2"), set("a2", gate.VerdictSuccess), adm("a3"),
		}},
		{name: "last-free-slot", src: two, setup: func(f *fastRun) { f.admit("p0") }, ops: []func(*fastRun) string{
			adm("a1"), adm("a2"), set("p0", gate.VerdictSuccess), adm("a3"), adm("a4"),
		}},
		{name: "ceiling", src: two, setup: func(f *fastRun) { f.admit("p0") }, ops: []func(*fastRun) string{
			func(f *fastRun) string { return f.admitW("a1", 1, nil) }, // paced: one held, ceiling 1
			func(f *fastRun) string { return f.admitW("a2", 2, nil) }, // the last slot below ceiling 2
			func(f *fastRun) string { return f.admitW("a3", 3, nil) }, // a ceiling above the limit: full
		}},
		{name: "lease-ended", src: two, setup: func(f *fastRun) {
			f.admit("p0")
			f.admit("p1")
			f.clock.Advance(10 * time.Second) // both leases end now: swept
		}, ops: []func(*fastRun) string{
			adm("a1"), set("p0", gate.VerdictSuccess), adm("a2"), adm("a3"),
		}},
		{name: "lease-ended-slot-free", src: func(s *gate.Source) {
			two(s)
			s.Limits.MaxConcurrency = 3
		}, setup: func(f *fastRun) {
			f.admit("p0")
			f.clock.Advance(5 * time.Second)
		}, ops: []func(*fastRun) string{after(5*time.Second, adm("a1"))}}, // p0's lease ends now: swept
		{name: "lease-ended-settle", src: two, setup: func(f *fastRun) {
			f.admit("p0")
			f.clock.Advance(5 * time.Second)
			f.admit("p2")
		}, ops: []func(*fastRun) string{after(5*time.Second, set("p2", gate.VerdictSuccess))}}, // p0's ends now
		{name: "probe-claimed-closed", src: two, setup: func(f *fastRun) {
			p := gate.Permit{ID: "p0", Epoch: f.admitPermit("p0").Epoch, Probe: true}
			f.ps["p0"] = p // a probe's outcome of a CLOSED breaker at its epoch: stale
		}, ops: []func(*fastRun) string{set("p0", gate.VerdictSuccess), adm("a1")}},
		{name: "probe", src: two, setup: func(f *fastRun) {
			f.admit("p0")
			f.admit("p1")
			f.settle("p0", gate.VerdictFailure)
			f.settle("p1", gate.VerdictFailure) // OPEN for 1s
			f.clock.Advance(time.Second)
		}, ops: []func(*fastRun) string{
			adm("a1"), // the probe: HALF_OPEN
			adm("a2"), // probe in flight
			set("a1", gate.VerdictSuccess),
			adm("a3"), // CLOSED again
			set("a3", gate.VerdictSuccess),
		}},
		{name: "probe-expired", src: two, setup: func(f *fastRun) {
			f.admit("p0")
			f.admit("p1")
			f.settle("p0", gate.VerdictFailure)
			f.settle("p1", gate.VerdictFailure)
			f.clock.Advance(time.Second)
			f.admit("pr") // the probe
			f.clock.Advance(5 * time.Second)
		}, ops: []func(*fastRun) string{
			adm("a1"), set("pr", gate.VerdictSuccess), set("a1", gate.VerdictSuccess), adm("a2"),
		}},
		{name: "consecutive", src: two, setup: func(f *fastRun) {
			f.admit("p0")
			f.admit("p1")
			f.settle("p0", gate.VerdictFailure) // one failure: consecutive 1
		}, ops: []func(*fastRun) string{
			set("p1", gate.VerdictSuccess),                                                       // resets consecutive
			adm("a1"), set("a1", gate.VerdictFailure), adm("a2"), set("a2", gate.VerdictFailure), // the second opens
			adm("a3"),
		}},
		{name: "rate-reached-by-this-outcome", src: func(s *gate.Source) {
			two(s)
			s.Limits.MaxConcurrency = 5
			s.Breaker.FailThreshold, s.Breaker.MinCalls, s.Breaker.FailRate, s.Breaker.Window = 10, 3, 0.5, 10*time.Second
		}, setup: func(f *fastRun) {
			f.settle("p0", gate.VerdictSuccess) // stale
			for _, id := range []string{"p0", "p1", "p2"} {
				f.admit(id)
			}
			f.settle("p0", gate.VerdictFailure)
		}, ops: []func(*fastRun) string{
			set("p1", gate.VerdictSuccess), // 2 calls, 1 failure
			adm("a1"),                      //
			set("p2", gate.VerdictFailure), // 3 calls, 2 failures: OPEN
			set("a1", gate.VerdictSuccess), // admitted before: stale
			adm("a2"),                      // refused
		}},
		{name: "window-rollover", src: func(s *gate.Source) {
			two(s)
			s.Breaker.FailThreshold, s.Breaker.MinCalls, s.Breaker.FailRate, s.Breaker.Window = 10, 2, 0.5, 10*time.Second
		}, setup: func(f *fastRun) {
			f.admit("p0")
			f.settle("p0", gate.VerdictFailure)
			f.admit("p1")
			f.clock.Advance(10 * time.Second) // p0's failure leaves the window
			f.admit("p2")
		}, ops: []func(*fastRun) string{
			set("p1", gate.VerdictSuccess), set("p2", gate.VerdictFailure), adm("a1"), set("a1", gate.VerdictFailure),
		}},
		{name: "stale-epoch", src: two, setup: func(f *fastRun) {
			f.admit("p0")
			f.ps["p0"] = gate.Permit{ID: "p0", Epoch: 7}
		}, ops: []func(*fastRun) string{
			set("p0", gate.VerdictSuccess), adm("a1"), set("nobody", gate.VerdictSuccess), adm("a2"),
		}},
		{name: "no-verdict", src: two, setup: func(f *fastRun) { f.admit("p0") }, ops: []func(*fastRun) string{
			set("p0", gate.VerdictNone), adm("a1"), set("a1", gate.VerdictForceOpen), adm("a2"),
		}},
		{name: "forced-closed", src: two, setup: func(f *fastRun) {
			must(f.be.Override(f.ctx, gate.OverrideRequest{Scope: f.scope, Source: f.src, Action: gate.ActionForceClosed, Actor: "t", Why: "t"}))(f.t)
			f.admit("p0")
		}, ops: []func(*fastRun) string{
			adm("a1"), set("p0", gate.VerdictFailure), set("a1", gate.VerdictSuccess), adm("a2"), adm("a3"),
		}},
		{name: "forced-open", src: two, setup: func(f *fastRun) {
			f.admit("p0")
			must(f.be.Override(f.ctx, gate.OverrideRequest{Scope: f.scope, Source: f.src, Action: gate.ActionForceOpen, Actor: "t", Why: "t"}))(f.t)
		}, ops: []func(*fastRun) string{adm("a1"), set("p0", gate.VerdictSuccess), adm("a2")}},
		{name: "disabled", src: two, setup: func(f *fastRun) {
			f.admit("p0")
			must(f.be.Override(f.ctx, gate.OverrideRequest{Scope: f.scope, Source: f.src, Action: gate.ActionDisable, Actor: "t", Why: "t"}))(f.t)
		}, ops: []func(*fastRun) string{set("p0", gate.VerdictSuccess), adm("a1"), set("a1", gate.VerdictFailure), adm("a2")}},
		{name: "rpm", src: func(s *gate.Source) {
			two(s)
			s.Limits.RPM, s.Limits.TPM, s.Limits.Lease = 3, 100, 2*time.Minute
		}, setup: func(f *fastRun) {
			f.admit("p0")
			f.admit("p1")
			f.clock.Advance(time.Minute) // the minute rolls over, the leases hold
		}, ops: []func(*fastRun) string{
			func(f *fastRun) string { return f.settleA("p0", gate.VerdictSuccess, 12, false) }, // actual tokens: the log
			set("p1", gate.VerdictSuccess), // no actual tokens
			adm("a1"), adm("a2"),
		}},
		{name: "rpm-actual-tokens", src: func(s *gate.Source) {
			two(s)
			s.Limits.RPM, s.Limits.TPM = 3, 100
		}, setup: func(f *fastRun) {
			f.admit("p0")
			f.admit("p1")
		}, ops: []func(*fastRun) string{
			func(f *fastRun) string { return f.settleA("p0", gate.VerdictSuccess, 12, false) },
			set("p1", gate.VerdictSuccess),
		}},
		{name: "line-of-one", src: func(s *gate.Source) {
			two(s)
			s.Limits.MaxConcurrency = 1
		}, setup: func(f *fastRun) {
			f.admit("p0")
			f.admitW("w1", 0, fastWaiter("w1", map[string]string{"s": "earlier"})) // full: w1 in line
		}, ops: []func(*fastRun) string{
			func(f *fastRun) string { return f.settleA("p0", gate.VerdictSuccess, -1, true) }, // the slot to w1
			func(f *fastRun) string { return f.admitW("a1", 0, fastWaiter("w2", nil)) },       // w1 called: not empty
			func(f *fastRun) string { return f.admitW("w1", 0, fastWaiter("w1", map[string]string{"s": "earlier"})) },
		}},
		{name: "empty-line", src: two, ops: []func(*fastRun) string{
			func(f *fastRun) string { return f.admitW("a1", 0, fastWaiter("w1", nil)) },
			func(f *fastRun) string { return f.settleA("a1", gate.VerdictSuccess, -1, true) },
			func(f *fastRun) string { return f.admitW("a2", 0, fastWaiter("w2", map[string]string{"s": ""})) },
			func(f *fastRun) string { return f.admitW("a3", 0, fastWaiter("w3", map[string]string{"s": "some"})) },
		}},
	}
	start := clock.Now()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := gatetest.Src("s", tc.src)
			run := func(be gate.Backend, scope string, batched bool, ps map[string]gate.Permit, lead bool) []string {
				clock.Set(start)
				f := &fastRun{t: t, ctx: ctx, be: be, clock: clock, scope: scope, src: src, ps: ps, keep: !batched}
				warm := gatetest.Src("warm")
				settle(t, ctx, be, scope, warm, admit(t, ctx, be, scope, "warm", warm).Permit, gate.VerdictSuccess)
				if tc.setup != nil {
					f.keep = true
					tc.setup(f)
					f.keep = !batched
				}
				out := make([]string, len(tc.ops))
				var fs []func()
				if lead {
					fs = append(fs, func() { _, _ = be.Settle(ctx, staleSettle(scope, src)) }) // loads the hash
				}
				for i, op := range tc.ops {
					fs = append(fs, func() { out[i] = op(f) })
				}
				runOps(t, b, h, scope, batched && be != gate.Backend(mem), fs) // memory: one at a time
				return out
			}
			// Led by the stale settle (the ops take the exits), and not
			// (the batch's first op of the source walks).
			for _, lead := range []bool{true, false} {
				p := fmt.Sprint(lead, "-")
				known := map[string]gate.Permit{}
				seq := run(b, p+"seq-"+tc.name, false, known, lead)
				bat := run(b, p+"bat-"+tc.name, true, known, lead)
				memo := run(mem, p+"mem-"+tc.name, false, map[string]gate.Permit{}, lead)
				for i := range seq {
					if seq[i] != bat[i] || seq[i] != memo[i] {
						t.Errorf("led %v, op %d:\n batched    %s\n sequential %s\n memory     %s", lead, i, bat[i], seq[i], memo[i])
					}
				}
				got, want := storedScope(t, ctx, b, c, p+"bat-"+tc.name, []string{"s"}), storedScope(t, ctx, b, c, p+"seq-"+tc.name, []string{"s"})
				for k, v := range want {
					if got[k] != v {
						t.Errorf("led %v, %s: batched %s, one at a time %s", lead, k, got[k], v)
					}
				}
			}
		})
	}
}
