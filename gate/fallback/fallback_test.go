package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/fallback"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{}) // go-redis logs every failed dial of the outages
	os.Exit(m.Run())
}

type change struct {
	degraded bool
	cause    error
}

type fixture struct {
	t       *testing.T
	ctx     context.Context
	srv     *redistest.Server
	shared  *redisgate.Backend
	sent    *redistest.Recorder
	clock   *gatetest.Clock
	b       *fallback.Backend
	mu      sync.Mutex
	changes []change
}

func newFixture(t *testing.T, mode fallback.Mode, replicas int) *fixture {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, srv: redistest.Start(t), sent: &redistest.Recorder{}, clock: gatetest.NewClock()}
	c := redis.NewClient(&redis.Options{
		Addr: f.srv.Addr, MaxRetries: -1, DialerRetries: 1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond, PoolTimeout: 200 * time.Millisecond,
	})
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(f.sent)
	shared, err := redisgate.New(c, redisgate.Options{Clock: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	f.shared = shared
	f.b = fallback.New(shared, fallback.Options{
		Mode: mode, Replicas: replicas, Now: f.clock.Now,
		OnChange: func(d bool, cause error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.changes = append(f.changes, change{d, cause})
		},
	})
	return f
}

func (f *fixture) admit(id string, src *gate.Source) (gate.Admission, error) {
	return f.b.Admit(f.ctx, gate.AdmitRequest{Scope: "fb", PermitID: id, Candidates: []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}}})
}

func (f *fixture) wantChanges(want ...bool) {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	var got []bool
	for _, c := range f.changes {
		got = append(got, c.degraded)
		if c.degraded && !errors.Is(c.cause, gate.ErrUnavailable) {
			f.t.Fatalf("degraded because of %v, want an error wrapping gate.ErrUnavailable", c.cause)
		}
		if !c.degraded && c.cause != nil {
			f.t.Fatalf("recovered with cause %v, want nil", c.cause)
		}
	}
	if !slices.Equal(got, want) {
		f.t.Fatalf("changes of mode %v, want %v", got, want)
	}
}

// poll calls cond every few milliseconds until it holds, for at most 20s.
func (f *fixture) poll(what string, cond func() bool) {
	f.t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-deadline:
			f.t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

// TestLocal: with Redis down, calls are served by a memory backend with this
// replica's share of the limits, without a round trip to Redis except one
// PING per PingEvery; when a PING answers, calls go back to Redis.
func TestLocal(t *testing.T) {
	f := newFixture(t, fallback.Local, 3)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 8 })

	a, err := f.admit("r1", src)
	if err != nil || !a.Granted || f.b.Degraded() {
		t.Fatalf("healthy: %+v %v degraded=%v", a, err, f.b.Degraded())
	}
	if got := f.sent.Names(); len(got) == 0 {
		t.Fatal("a healthy call sent nothing to Redis")
	}
	// Settled, else it holds one of the local slots (TestLocalLeavesRoomForRedisPermits).
	if _, err := f.b.Settle(f.ctx, gate.SettleRequest{Scope: "fb", Source: src, PermitID: "r1", Epoch: a.Permit.Epoch, ActualTokens: -1}); err != nil {
		t.Fatal(err)
	}

	f.srv.Stop()
	// Many callers find Redis down at once: one change of mode.
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if _, err := f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	f.wantChanges(true)
	// 8 slots over 3 replicas: 3 here, taken all-or-nothing like any limit.
	for i := range 3 {
		if a, err := f.admit(fmt.Sprint("l", i), src); err != nil || !a.Granted {
			t.Fatalf("local admission %d: %+v %v", i, a, err)
		}
	}
	if a, err := f.admit("l3", src); err != nil || a.Granted || a.Rejections[0].Reason != gate.ReasonRateLimited {
		t.Fatalf("fourth local admission: %+v %v, want rate_limited (3 of 8 slots)", a, err)
	}
	// Peek's verdict is the local Admit's, with the share: full, not 3 of 8.
	if v, err := f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}}); err != nil || v.Sources[0].Verdict.Reason != gate.ReasonRateLimited {
		t.Fatalf("local verdict with the share held: %+v %v, want rate_limited", v, err)
	}
	// A pacer ceiling is shared too: 6 of 8 is 2 here, and 3 are out.
	if v, err := f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}, Ceilings: []int{6}}); err != nil || v.Sources[0].Verdict.Reason != gate.ReasonAdaptivePaced {
		t.Fatalf("local verdict under ceiling 6: %+v %v, want adaptive_paced", v, err)
	}
	if !f.b.Degraded() {
		t.Fatal("not degraded with Redis down")
	}
	f.wantChanges(true)
	f.sent.Names() // the call that found Redis down

	f.clock.Advance(time.Second - time.Millisecond)
	if _, err := f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}}); err != nil {
		t.Fatal(err)
	}
	if got := f.sent.Names(); len(got) != 0 {
		t.Fatalf("degraded calls before PingEvery sent %v to Redis", got)
	}
	f.clock.Advance(time.Millisecond)
	f.admit("l4", src)
	f.admit("l5", src)
	if got := f.sent.Names(); !slices.Equal(got, []string{"ping"}) {
		t.Fatalf("degraded calls after PingEvery sent %v, want one ping", got)
	}
	f.wantChanges(true)

	f.srv.Start()
	// The client may need a moment to dial again: step the clock a
	// PingEvery at a time until a check gets through.
	f.poll("Redis to be used again", func() bool {
		f.clock.Advance(time.Second)
		if _, err := f.admit("back", src); err != nil {
			t.Fatal(err)
		}
		return !f.b.Degraded()
	})
	f.wantChanges(true, false)
	// Redis's state is the fresh server's: the local permits are not there.
	v, err := f.shared.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
	if err != nil || v.Sources[0].Quota.InFlight != 1 {
		t.Fatalf("Redis after recovery: %+v %v, want the one permit granted since", v, err)
	}
}

// TestLocalPermitsKeepTheirSlots: permits granted locally still hold their
// slots when Redis is back, which Redis does not know of. Redis's Admits and
// Peeks leave them room until they are settled (locally, where their slots
// are) or their leases end: never more holders than max_concurrency across
// the return.
func TestLocalPermitsKeepTheirSlots(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 2; s.Limits.Lease = 10 * time.Second })
	settle := func(p gate.Permit) gate.Settlement {
		t.Helper()
		st, err := f.b.Settle(f.ctx, gate.SettleRequest{Scope: "fb", Source: src, PermitID: p.ID, Epoch: p.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	granted := func(id string) (gate.Permit, bool) {
		t.Helper()
		a, err := f.admit(id, src)
		if err != nil {
			t.Fatal(err)
		}
		return a.Permit, a.Granted
	}
	r0, ok := granted("r0") // Redis has the scope
	if !ok {
		t.Fatal("healthy admission refused")
	}
	settle(r0) // else it holds one of the local slots (TestLocalLeavesRoomForRedisPermits)
	f.srv.Stop()
	f.poll("the local mode", func() bool {
		f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
		return f.b.Degraded()
	})
	var local []gate.Permit
	for _, id := range []string{"l0", "l1"} {
		p, ok := granted(id)
		if !ok {
			t.Fatalf("local admission %s refused", id)
		}
		local = append(local, p)
	}
	f.srv.Start() // empty: r0 is gone with it
	f.poll("Redis to be used again", func() bool {
		f.clock.Advance(time.Second)
		f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
		return !f.b.Degraded()
	})

	// Two local holders: Redis grants nothing, and Peek says so.
	if _, ok := granted("r1"); ok {
		t.Fatal("Redis granted a third holder on max_concurrency 2 while two local permits are out")
	}
	if v, err := f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}}); err != nil || v.Sources[0].Verdict.Reason != gate.ReasonRateLimited || v.Sources[0].Quota.InFlight != 2 {
		t.Fatalf("Peek with two local permits out: %+v %v, want rate_limited with both in flight", v, err)
	}
	// A local permit settled after the return frees its slot.
	if st := settle(local[0]); !st.Released {
		t.Fatalf("settling a local permit after the return: %+v, want its slot released", st)
	}
	r2, ok := granted("r2")
	if !ok {
		t.Fatal("Redis refused the slot the settled local permit freed")
	}
	if _, ok := granted("r3"); ok {
		t.Fatal("a third holder: one local permit and r2 hold both slots")
	}
	if st := settle(r2); !st.Released {
		t.Fatalf("settling Redis's permit: %+v, want released", st)
	}
	// A local permit whose holder never reports holds its slot until its
	// lease ends, and no longer.
	f.clock.Advance(src.Limits.Lease)
	for _, id := range []string{"r4", "r5"} {
		if _, ok := granted(id); !ok {
			t.Fatalf("admission %s refused after the local lease ended", id)
		}
	}
}

// TestFailClosed: with Redis down every call fails with an error wrapping
// gate.ErrUnavailable, and the first success after the restart ends the
// degradation.
func TestFailClosed(t *testing.T) {
	f := newFixture(t, fallback.FailClosed, 3)
	src := gatetest.Src("s")
	if _, err := f.admit("r1", src); err != nil {
		t.Fatal(err)
	}
	f.srv.Stop()
	for i := range 3 {
		if _, err := f.admit(fmt.Sprint("x", i), src); !errors.Is(err, gate.ErrUnavailable) {
			t.Fatalf("call %d with Redis down: %v, want gate.ErrUnavailable", i, err)
		}
	}
	if !f.b.Degraded() {
		t.Fatal("not degraded with Redis down")
	}
	f.srv.Start()
	f.poll("a call to succeed after the restart", func() bool {
		_, err := f.admit("back", src)
		if err != nil && !errors.Is(err, gate.ErrUnavailable) {
			t.Fatalf("after the restart: %v", err)
		}
		return err == nil
	})
	if f.b.Degraded() {
		t.Fatal("still degraded after a success")
	}
	f.wantChanges(true, false)
}

// TestOverrideIsNeverLocal: an operator's action must reach the shared state.
func TestOverrideIsNeverLocal(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	f.srv.Stop()
	_, err := f.b.Override(f.ctx, gate.OverrideRequest{Scope: "fb", Source: gatetest.Src("s"), Action: gate.ActionForceOpen})
	if !errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("override with Redis down: %v, want gate.ErrUnavailable", err)
	}
}

// A waiter left in a local line by one outage (its call granted or gone
// through Redis since) does not hold the next outage's line: each outage's
// waiters are its own, and the old ones leave with their lease.
func TestLocalLinesForgetAnEarlierOutage(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1; s.Limits.Lease = 10 * time.Second })
	waiter := func(id string) *gate.Waiter {
		return &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 1, Lease: time.Second}
	}
	degrade := func() {
		t.Helper()
		f.srv.Stop()
		f.poll("the local mode", func() bool {
			f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
			return f.b.Degraded()
		})
	}
	degrade()
	if a, err := f.admit("l0", src); err != nil || !a.Granted { // the local slot
		t.Fatalf("local admission: %+v, %v", a, err)
	}
	join := &gate.LineRead{Lease: time.Second, Join: waiter("ghost"), Joins: []string{"s"}}
	if _, err := f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}, Line: join}); err != nil {
		t.Fatal(err)
	}
	f.srv.Start()
	f.poll("Redis to be used again", func() bool {
		f.clock.Advance(time.Second)
		f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
		return !f.b.Degraded()
	})
	f.clock.Advance(time.Minute) // l0's lease and the ghost's are over
	degrade()
	a, err := f.b.Admit(f.ctx, gate.AdmitRequest{Scope: "fb", PermitID: "w0", Line: waiter("w"),
		Candidates: []gate.Candidate{{Source: src, Ceiling: 1}}})
	if err != nil || !a.Granted {
		t.Fatalf("the next outage's first call: %+v, %v; want granted (the earlier outage's waiter is gone)", a, err)
	}
}

// degrade stops Redis and calls until the fallback has switched to local.
func (f *fixture) degrade(src *gate.Source) {
	f.t.Helper()
	f.srv.Stop()
	f.poll("the local mode", func() bool {
		f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
		return f.b.Degraded()
	})
}

// TestLocalKeepsAForcedOpenSource: an operator forced a source open in
// Redis (a leaked key, a provider to keep away from); Redis is lost. The
// local gate must keep refusing the source, as Redis would: a local gate
// that knew nothing of the override would grant every caller the source
// the operator closed (the cooldown memo stores nothing for a forced open,
// whose retry_after is 0, so nothing above the gate would catch it either).
func TestLocalKeepsAForcedOpenSource(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	src := gatetest.Src("s")
	if _, err := f.b.Override(f.ctx, gate.OverrideRequest{Scope: "fb", Source: src, Action: gate.ActionForceOpen, Actor: "ops", Why: "leaked key"}); err != nil {
		t.Fatal(err)
	}
	if a, err := f.admit("r0", src); err != nil || a.Granted || a.Rejections[0].Reason != gate.ReasonForcedOpen {
		t.Fatalf("forced open on Redis: %+v %v, want forced_open", a, err)
	}
	f.degrade(src)
	if n := f.b.Kept(); n != 1 {
		t.Fatalf("Kept() = %d breakers kept at the switch, want 1 (the forced open one)", n)
	}
	a, err := f.admit("l0", src)
	if err != nil || a.Granted || len(a.Rejections) != 1 || a.Rejections[0].Reason != gate.ReasonForcedOpen {
		t.Fatalf("local admission of a source forced open in Redis: %+v %v, want refused forced_open", a, err)
	}
	v, err := f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
	if err != nil || v.Sources[0].Breaker.Override != gate.ForcedOpen || v.Sources[0].Breaker.Actor != "ops" || v.Sources[0].Breaker.Why != "leaked key" {
		t.Fatalf("local view of the forced-open source: %+v %v, want forced_open by ops (leaked key)", v, err)
	}
}

// TestLocalKeepsAnOpenBreaker: a source OPEN in Redis (its cooldown still
// running) is OPEN in the local gate too, with the cooldown left, and turns
// HALF_OPEN there after it: one probe, not every caller, where a local
// breaker started CLOSED would grant every caller at once.
func TestLocalKeepsAnOpenBreaker(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Breaker.FailThreshold = 1
		s.Breaker.Cooldown, s.Breaker.MaxCooldown = 30*time.Second, time.Minute
	})
	a, err := f.admit("r0", src)
	if err != nil || !a.Granted {
		t.Fatalf("healthy admission: %+v %v", a, err)
	}
	st, err := f.b.Settle(f.ctx, gate.SettleRequest{Scope: "fb", Source: src, PermitID: "r0", Epoch: a.Permit.Epoch, Verdict: gate.VerdictFailure, ActualTokens: -1})
	if err != nil || st.Breaker.State != gate.Open {
		t.Fatalf("failure on Redis: %+v %v, want OPEN", st, err)
	}
	f.degrade(src)
	a, err = f.admit("l0", src)
	if err != nil || a.Granted || a.Rejections[0].Reason != gate.ReasonCircuitOpen {
		t.Fatalf("local admission of a source OPEN in Redis: %+v %v, want circuit_open", a, err)
	}
	if left := a.Rejections[0].RetryAfter; left <= 0 || left > src.Breaker.Cooldown {
		t.Fatalf("local retry_after %v, want the cooldown left (0, %v]", left, src.Breaker.Cooldown)
	}
	f.clock.Advance(src.Breaker.Cooldown)
	if a, err := f.admit("l1", src); err != nil || !a.Granted || !a.Permit.Probe {
		t.Fatalf("first local admission after the cooldown: %+v %v, want the probe", a, err)
	}
	if a, err := f.admit("l2", src); err != nil || a.Granted || a.Rejections[0].Reason != gate.ReasonProbeInFlight {
		t.Fatalf("second local admission after the cooldown: %+v %v, want probe_in_flight", a, err)
	}
}

// TestLocalStartsEachOutageFromRedis: the local gate of a second outage
// starts from what this replica knows of Redis then, not from the first
// outage's local state: an override cleared on Redis in between is not
// forced open locally again, and a source forced closed in between is.
func TestLocalStartsEachOutageFromRedis(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	a, b := gatetest.Src("a"), gatetest.Src("b")
	override := func(src *gate.Source, action gate.Action) {
		t.Helper()
		if _, err := f.b.Override(f.ctx, gate.OverrideRequest{Scope: "fb", Source: src, Action: action, Actor: "ops", Why: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	back := func() {
		t.Helper()
		f.srv.Start()
		f.poll("Redis to be used again", func() bool {
			f.clock.Advance(time.Second)
			f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{a}})
			return !f.b.Degraded()
		})
	}
	override(a, gate.ActionForceOpen)
	f.degrade(a)
	if got, err := f.admit("l0", a); err != nil || got.Granted {
		t.Fatalf("first outage, a forced open: %+v %v, want refused", got, err)
	}
	back() // empty: the replica re-asserts its records
	override(a, gate.ActionClear)
	override(b, gate.ActionForceOpen)
	f.degrade(a)
	if got, err := f.admit("l1", a); err != nil || !got.Granted {
		t.Fatalf("second outage, a cleared since: %+v %v, want granted", got, err)
	}
	if got, err := f.admit("l2", b); err != nil || got.Granted || got.Rejections[0].Reason != gate.ReasonForcedOpen {
		t.Fatalf("second outage, b forced open since: %+v %v, want forced_open", got, err)
	}
}

// TestLocalLeavesRoomForRedisPermits: permits Redis granted this replica
// before it went away still hold their upstream slots (their callers are
// running), which the local gate does not know of: until they are settled
// or their leases end, it admits their sources with that many fewer slots,
// so the switch never makes more holders than max_concurrency (the mirror
// of TestLocalPermitsKeepTheirSlots), where a full max_concurrency on top
// of them would make 4 holders on max_concurrency 2.
func TestLocalLeavesRoomForRedisPermits(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 2; s.Limits.Lease = 10 * time.Second })
	var held []gate.Permit
	for _, id := range []string{"r0", "r1"} {
		a, err := f.admit(id, src)
		if err != nil || !a.Granted {
			t.Fatalf("healthy admission %s: %+v %v", id, a, err)
		}
		held = append(held, a.Permit)
	}
	f.degrade(src)
	if a, err := f.admit("l0", src); err != nil || a.Granted || a.Rejections[0].Reason != gate.ReasonRateLimited {
		t.Fatalf("local admission with two Redis permits out on max_concurrency 2: %+v %v, want rate_limited", a, err)
	}
	if v, err := f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}}); err != nil || v.Sources[0].Verdict.Reason != gate.ReasonRateLimited || v.Sources[0].Quota.InFlight != 2 {
		t.Fatalf("local Peek with two Redis permits out: %+v %v, want rate_limited with both in flight", v, err)
	}
	// A Redis permit settled while Redis is away frees its slot locally,
	// and says so (Released wakes the callers waiting for it).
	p := held[0]
	if st, err := f.b.Settle(f.ctx, gate.SettleRequest{Scope: "fb", Source: src, PermitID: p.ID, Epoch: p.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1}); err != nil || !st.Released {
		t.Fatalf("settling a Redis permit while Redis is away: %+v %v, want released", st, err)
	}
	f.clock.Advance(src.Limits.Lease / 2)
	if a, err := f.admit("l1", src); err != nil || !a.Granted {
		t.Fatalf("local admission after a Redis permit was settled: %+v %v, want granted", a, err)
	}
	if a, err := f.admit("l2", src); err != nil || a.Granted {
		t.Fatalf("a third holder (r1, l1 hold both slots): %+v %v, want refused", a, err)
	}
	// A Redis permit whose holder never reports holds its slot until its
	// lease ends, and no longer (l1's runs half a lease longer).
	f.clock.Advance(src.Limits.Lease / 2)
	if a, err := f.admit("l3", src); err != nil || !a.Granted {
		t.Fatalf("local admission after r1's lease ended: %+v %v, want granted", a, err)
	}
	if a, err := f.admit("l4", src); err != nil || a.Granted {
		t.Fatalf("a third holder (l1, l3 hold both slots): %+v %v, want refused", a, err)
	}
}

// TestLocalKeepsTheProbeOut: this replica holds Redis's HALF_OPEN probe of
// a source when Redis is lost. The local gate keeps that probe out (other
// callers are refused probe_in_flight, as on Redis), and the probe's
// outcome, reported while Redis is away, decides the local breaker: a
// success closes it. A local breaker started CLOSED would grant every
// caller the source whose recovery is still being tested.
func TestLocalKeepsTheProbeOut(t *testing.T) {
	for _, tc := range []struct {
		verdict gate.Verdict
		after   gate.Reason // a local admission after the probe's outcome
	}{
		{gate.VerdictSuccess, gate.ReasonNone},
		{gate.VerdictFailure, gate.ReasonCircuitOpen},
	} {
		t.Run(tc.verdict.String(), func(t *testing.T) {
			f := newFixture(t, fallback.Local, 1)
			src := gatetest.Src("s", func(s *gate.Source) { s.Breaker.FailThreshold = 1 })
			a, err := f.admit("r0", src)
			if err != nil || !a.Granted {
				t.Fatalf("healthy admission: %+v %v", a, err)
			}
			if st, err := f.b.Settle(f.ctx, gate.SettleRequest{Scope: "fb", Source: src, PermitID: "r0", Epoch: a.Permit.Epoch, Verdict: gate.VerdictFailure, ActualTokens: -1}); err != nil || st.Breaker.State != gate.Open {
				t.Fatalf("failure on Redis: %+v %v, want OPEN", st, err)
			}
			f.clock.Advance(src.Breaker.Cooldown)
			probe, err := f.admit("r1", src)
			if err != nil || !probe.Granted || !probe.Permit.Probe {
				t.Fatalf("admission after the cooldown: %+v %v, want the probe", probe, err)
			}
			f.degrade(src)
			if a, err := f.admit("l0", src); err != nil || a.Granted || a.Rejections[0].Reason != gate.ReasonProbeInFlight {
				t.Fatalf("local admission while Redis's probe is out: %+v %v, want probe_in_flight", a, err)
			}
			p := probe.Permit
			st, err := f.b.Settle(f.ctx, gate.SettleRequest{Scope: "fb", Source: src, PermitID: p.ID, Epoch: p.Epoch, Probe: true, Verdict: tc.verdict, ActualTokens: -1})
			if err != nil || st.Effect != gate.EffectApplied {
				t.Fatalf("the probe's outcome while Redis is away: %+v %v, want applied", st, err)
			}
			a, err = f.admit("l1", src)
			if err != nil || (tc.after == gate.ReasonNone) != a.Granted || (!a.Granted && a.Rejections[0].Reason != tc.after) {
				t.Fatalf("local admission after the probe's %v: %+v %v, want %v", tc.verdict, a, err, tc.after)
			}
		})
	}
}

// TestFlappingRedisLeaksNothing: Redis stalls and comes back again and
// again (SIGSTOP, SIGCONT) while callers take and settle permits, each
// switch to local and back with permits out on both sides. Holders never
// exceed max_concurrency, and once Redis stays and its give-backs are done,
// no slot is held by nobody, in Redis or in the local gate.
func TestFlappingRedisLeaksNothing(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	const max = 3
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = max; s.Limits.Lease = time.Hour })
	ctx, stop := context.WithCancel(f.ctx)
	loop := make(chan struct{})
	go func() { defer close(loop); f.shared.RunGiveBacks(ctx, 5*time.Millisecond) }()
	defer func() { stop(); <-loop }()

	var mu sync.Mutex
	holders := 0
	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				id := fmt.Sprintf("w%d-%d", w, i)
				a, err := f.admit(id, src)
				if err != nil || !a.Granted {
					continue
				}
				mu.Lock()
				holders++
				if holders > max {
					t.Errorf("%d holders on max_concurrency %d (degraded=%v)", holders, max, f.b.Degraded())
				}
				mu.Unlock()
				// The attempt: a read of the backend, while others admit.
				f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
				mu.Lock()
				holders-- // before the settle frees the slot: counts no holder twice
				mu.Unlock()
				for {
					_, err := f.b.Settle(f.ctx, gate.SettleRequest{Scope: "fb", Source: src, PermitID: id, Epoch: a.Permit.Epoch, Probe: a.Permit.Probe, Verdict: gate.VerdictSuccess, ActualTokens: -1})
					if err == nil {
						break
					}
				}
			}
		})
	}
	for range 6 {
		f.srv.Pause()
		f.poll("the local mode", func() bool { return f.b.Degraded() })
		f.srv.Resume()
		f.poll("Redis to be used again", func() bool {
			f.clock.Advance(fallback.DefaultPingEvery)
			return !f.b.Degraded()
		})
	}
	close(done)
	wg.Wait()
	f.poll("the give-backs to be done", func() bool {
		f.clock.Advance(fallback.DefaultPingEvery)
		f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
		return !f.b.Degraded() && f.shared.GiveBacks().Queued == 0
	})
	v, err := f.shared.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
	if err != nil || v.Sources[0].Quota.InFlight != 0 {
		t.Fatalf("Redis after the flapping, every permit settled: %+v %v, want no slot held", v, err)
	}
	if a, err := f.admit("last", src); err != nil || !a.Granted {
		t.Fatalf("an admission after the flapping: %+v %v", a, err)
	}
}

// TestShareOfHugeLimitsSaturates: a limit near the top of its type (an
// rpm of 2^63-1 meant as "no real limit") divided among replicas is about
// half of it, not 1: rounding up as (v+n-1)/n would wrap negative and give
// each replica 1 request a minute and 1 slot.
func TestShareOfHugeLimitsSaturates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := fallback.New(gatetest.Down{}, fallback.Options{Mode: fallback.Local, Replicas: 2})
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Limits.MaxConcurrency, s.Limits.RPM, s.Limits.TPM = math.MaxInt, math.MaxInt64, math.MaxInt64
	})
	for i := range 3 {
		a, err := b.Admit(ctx, gate.AdmitRequest{Scope: "s", PermitID: fmt.Sprint("p", i), Tokens: 1000,
			Candidates: []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}}})
		if err != nil || !a.Granted {
			t.Fatalf("local admission %d with limits of 2^63-1 over 2 replicas: %+v %v, want granted", i, a, err)
		}
	}
}

// TestLocalKeepsAnOpenOfAnEarlierOutage: Redis flaps while the upstream is
// down. The local gate of one outage opens the breaker; Redis comes back
// for a moment (and learns nothing of it); the next outage's local gate
// still refuses the source for the rest of that cooldown, rather than
// starting CLOSED and failing fail_threshold attempts again.
func TestLocalKeepsAnOpenOfAnEarlierOutage(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Breaker.FailThreshold = 1
		// Long enough that the clock steps of the recovery below (one a
		// PingEvery, while Redis restarts) do not end it.
		s.Breaker.Cooldown, s.Breaker.MaxCooldown = time.Hour, time.Hour
	})
	f.degrade(src)
	a, err := f.admit("l0", src)
	if err != nil || !a.Granted {
		t.Fatalf("local admission: %+v %v", a, err)
	}
	if st, err := f.b.Settle(f.ctx, gate.SettleRequest{Scope: "fb", Source: src, PermitID: "l0", Epoch: a.Permit.Epoch, Verdict: gate.VerdictFailure, ActualTokens: -1}); err != nil || st.Breaker.State != gate.Open {
		t.Fatalf("a local failure: %+v %v, want the local breaker OPEN", st, err)
	}
	f.srv.Start()
	f.poll("Redis to be used again", func() bool {
		f.clock.Advance(time.Second)
		f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
		return !f.b.Degraded()
	})
	f.degrade(src)
	if a, err := f.admit("l1", src); err != nil || a.Granted || a.Rejections[0].Reason != gate.ReasonCircuitOpen {
		t.Fatalf("the next outage, within the local cooldown: %+v %v, want circuit_open", a, err)
	}
	f.clock.Advance(src.Breaker.Cooldown)
	if a, err := f.admit("l2", src); err != nil || !a.Granted || !a.Permit.Probe {
		t.Fatalf("after the cooldown: %+v %v, want the probe", a, err)
	}
}

// TestHandBackKeepsThePacerCeiling: a replica's pacer ceiling bounds the
// holders of a source, and after the hand-back the local permits still out
// are holders Redis does not know of: with one out and a ceiling of 2 of 4,
// Redis grants one more, not two (the local permits are taken from the
// ceiling too, not from max_concurrency only).
func TestHandBackKeepsThePacerCeiling(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 4; s.Limits.Lease = 10 * time.Second })
	paced := func(id string) gate.Admission {
		t.Helper()
		a, err := f.b.Admit(f.ctx, gate.AdmitRequest{Scope: "fb", PermitID: id, Candidates: []gate.Candidate{{Source: src, Ceiling: 2}}})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	f.degrade(src)
	if a := paced("l0"); !a.Granted {
		t.Fatalf("local admission: %+v", a)
	}
	f.srv.Start()
	f.poll("Redis to be used again", func() bool {
		f.clock.Advance(time.Second)
		f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
		return !f.b.Degraded()
	})
	if a := paced("r1"); !a.Granted {
		t.Fatalf("Redis admission with one local permit out under ceiling 2: %+v, want granted", a)
	}
	if a := paced("r2"); a.Granted || a.Rejections[0].Reason != gate.ReasonAdaptivePaced && a.Rejections[0].Reason != gate.ReasonRateLimited {
		t.Fatalf("a third holder under ceiling 2: %+v, want refused", a)
	}
	v, err := f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}, Ceilings: []int{2}})
	if err != nil || v.Sources[0].Verdict.Reason == gate.ReasonNone {
		t.Fatalf("Peek under ceiling 2 with two holders: %+v %v, want refused as Admit does", v, err)
	}
}

// TestLocalKeepsItsProbeAcrossAFlap: the local gate of one outage hands
// its probe out; Redis comes back for a moment and goes again. The next
// outage's local gate keeps that probe out (others are refused
// probe_in_flight) and its outcome still decides the breaker, rather than
// starting CLOSED and admitting everyone to a source being tested.
func TestLocalKeepsItsProbeAcrossAFlap(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Breaker.FailThreshold = 1
		// Long enough that the clock steps of the recovery below (while
		// Redis restarts) do not end the probe's lease.
		s.Breaker.ProbeTTL = time.Hour
	})
	f.degrade(src)
	a, err := f.admit("l0", src)
	if err != nil || !a.Granted {
		t.Fatalf("local admission: %+v %v", a, err)
	}
	if st, err := f.b.Settle(f.ctx, gate.SettleRequest{Scope: "fb", Source: src, PermitID: "l0", Epoch: a.Permit.Epoch, Verdict: gate.VerdictFailure, ActualTokens: -1}); err != nil || st.Breaker.State != gate.Open {
		t.Fatalf("a local failure: %+v %v, want OPEN", st, err)
	}
	f.clock.Advance(src.Breaker.Cooldown)
	probe, err := f.admit("l1", src)
	if err != nil || !probe.Granted || !probe.Permit.Probe {
		t.Fatalf("local admission after the cooldown: %+v %v, want the probe", probe, err)
	}
	f.srv.Start()
	f.poll("Redis to be used again", func() bool {
		f.clock.Advance(time.Second)
		f.b.Peek(f.ctx, gate.PeekRequest{Scope: "fb", Sources: []*gate.Source{src}})
		return !f.b.Degraded()
	})
	f.degrade(src)
	if a, err := f.admit("l2", src); err != nil || a.Granted || a.Rejections[0].Reason != gate.ReasonProbeInFlight {
		t.Fatalf("the next outage with the local probe out: %+v %v, want probe_in_flight", a, err)
	}
	p := probe.Permit
	if st, err := f.b.Settle(f.ctx, gate.SettleRequest{Scope: "fb", Source: src, PermitID: p.ID, Epoch: p.Epoch, Probe: true, Verdict: gate.VerdictSuccess, ActualTokens: -1}); err != nil || st.Effect != gate.EffectApplied || st.Breaker.State != gate.Closed {
		t.Fatalf("the probe's success: %+v %v, want applied, CLOSED", st, err)
	}
}

// TestLocalCountsTheMinuteOnRedis: the requests and tokens Redis admitted
// for this replica in the last minute count in the local gate's minute at
// the switch, so that a source's rpm and tpm hold across it: with rpm 4,
// 3 admitted on Redis leave 1 to the local gate, until they leave the
// minute, where an empty local minute would grant 4 more at once.
func TestLocalCountsTheMinuteOnRedis(t *testing.T) {
	f := newFixture(t, fallback.Local, 1)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.RPM, s.Limits.TPM = 4, 1000 })
	admit := func(id string, tokens int64) gate.Admission {
		t.Helper()
		a, err := f.b.Admit(f.ctx, gate.AdmitRequest{Scope: "fb", PermitID: id, Tokens: tokens, Candidates: []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}}})
		if err != nil {
			t.Fatal(err)
		}
		if a.Granted {
			if _, err := f.b.Settle(f.ctx, gate.SettleRequest{Scope: "fb", Source: src, PermitID: id, Epoch: a.Permit.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1}); err != nil {
				t.Fatal(err)
			}
		}
		return a
	}
	for i := range 3 {
		if a := admit(fmt.Sprint("r", i), 100); !a.Granted {
			t.Fatalf("Redis admission %d: %+v", i, a)
		}
	}
	f.clock.Advance(10 * time.Second)
	f.degrade(src)
	if a := admit("l0", 100); !a.Granted {
		t.Fatalf("the fourth request of the minute, local: %+v, want granted", a)
	}
	a := admit("l1", 100)
	if a.Granted || a.Rejections[0].Reason != gate.ReasonRateLimited {
		t.Fatalf("the fifth request of the minute (rpm 4), local: %+v, want rate_limited", a)
	}
	if left := a.Rejections[0].RetryAfter; left != 50*time.Second {
		t.Fatalf("retry_after %v, want 50s: when the first Redis admission leaves the minute", left)
	}
	f.clock.Advance(50 * time.Second)
	if a := admit("l2", 100); !a.Granted {
		t.Fatalf("after the Redis admissions left the minute: %+v, want granted", a)
	}
}
