package redisgate_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// failFast are client options that give up quickly: no retries (go-redis
// spells "none" -1), one dial attempt, short timeouts.
func failFast(addr string) *redis.Options {
	return &redis.Options{
		Addr: addr, MaxRetries: -1, DialerRetries: 1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond, PoolTimeout: 200 * time.Millisecond,
	}
}

// budget is the longest one call may take with o: wait for a connection,
// dial, write, read.
func budget(o *redis.Options) time.Duration {
	return o.PoolTimeout + o.DialTimeout + o.WriteTimeout + o.ReadTimeout
}

// TestOutage: Redis is killed in the middle of a load and restarted.
// Every call during the outage fails, within the client's timeouts, with an
// error wrapping gate.ErrUnavailable; afterwards calls succeed again, and
// the permits whose outcome could not be reported during the outage give
// their slots back when their leases end. The server keeps an fsync'ed AOF
// so that what it held before the kill is there after the restart.
func TestOutage(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	opts := failFast(srv.Addr)
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	clock := gatetest.NewClock()
	b := newBackend(t, c, redisgate.Options{Clock: clock.Now, Timeout: budget(opts)})
	const scope = "outage"
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 4; s.Limits.Lease = 10 * time.Second })

	var (
		stop      atomic.Bool
		ok, fails atomic.Int64
		wg        sync.WaitGroup
		mu        sync.Mutex
		problems  []string
	)
	report := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 10 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	// call runs one Backend call and checks how it failed, if it did.
	call := func(what string, f func() error) bool {
		start := time.Now()
		err := f()
		took := time.Since(start)
		if err == nil {
			ok.Add(1)
			return true
		}
		fails.Add(1)
		if !errors.Is(err, gate.ErrUnavailable) {
			report("%s: %v does not wrap gate.ErrUnavailable", what, err)
		}
		if took > budget(opts) {
			report("%s failed after %v, beyond the client's budget %v", what, took, budget(opts))
		}
		return false
	}
	// Two permits whose holders never come back, taken before the load (a
	// load that stalls past the client's timeouts leaks slots to the
	// give-back queue, which no loop here runs: taken after it, they might
	// never be granted).
	var lost []gate.Permit
	for i := range 2 {
		a := admit(t, ctx, b, scope, fmt.Sprint("lost", i), src)
		if !a.Granted {
			t.Fatalf("lost%d: refused on an idle scope: %+v", i, a)
		}
		lost = append(lost, a.Permit)
	}
	for w := range 6 {
		wg.Go(func() {
			for k := 0; !stop.Load(); k++ {
				var a gate.Admission
				if !call("admit", func() (err error) {
					a, err = b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: fmt.Sprint("w", w, "-", k), Candidates: []gate.Candidate{{Source: src, Ceiling: 4}}})
					return err
				}) || !a.Granted {
					continue
				}
				call("settle", func() error {
					_, err := b.Settle(ctx, gate.SettleRequest{Scope: scope, Source: src, PermitID: a.Permit.ID, Epoch: a.Permit.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1})
					return err
				})
			}
		})
	}
	waitFor(t, func() bool { return ok.Load() > 50 }, "the load to run")

	srv.Stop()
	before := fails.Load()
	waitFor(t, func() bool { return fails.Load() > before+50 }, "calls to fail during the outage")
	srv.Start()
	after := ok.Load()
	waitFor(t, func() bool { return ok.Load() > after+50 }, "calls to succeed after the restart")
	stop.Store(true)
	wg.Wait()
	for _, p := range problems {
		t.Error(p)
	}

	// The lost permits (and any whose outcome was lost in the outage) still
	// hold their slots, until their leases end.
	q := peek(t, ctx, b, scope, src).Quota
	t.Logf("%d calls succeeded, %d failed; %d slots held after the restart", ok.Load(), fails.Load(), q.InFlight)
	if q.InFlight < len(lost) {
		t.Fatalf("after the restart %d in flight, want at least the %d lost permits (was state lost?)", q.InFlight, len(lost))
	}
	clock.Advance(src.Limits.Lease)
	if q := peek(t, ctx, b, scope, src).Quota; q.InFlight != 0 {
		t.Fatalf("after the leases ended %d still in flight", q.InFlight)
	}
	for i := range src.Limits.MaxConcurrency {
		if a := admit(t, ctx, b, scope, fmt.Sprint("fresh", i), src); !a.Granted {
			t.Fatalf("slot %d not free after the leases ended: %+v", i, a)
		}
	}
	if s := settle(t, ctx, b, scope, src, lost[0], gate.VerdictFailure); s.Released || s.Effect != gate.EffectStale {
		t.Fatalf("outcome of a permit whose lease ended: %+v, want stale and not released", s)
	}
}

// TestNoAdmitAfterStateLoss: a replica that knows a source OPEN (or
// FORCED_OPEN) never grants it after Redis lost the scope, not even once
// and without waiting for RunGiveBacks (not running here): Admit checks the
// scope's marker in its own script run and re-asserts first. It holds
// whichever replica finds the loss first: one that never saw the scope
// (fresh) may grant once, and after a knowing replica's next Admit nobody
// grants.
func TestNoAdmitAfterStateLoss(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	knows := newBackend(t, srv.Client(t), redisgate.Options{})
	other := newBackend(t, srv.Client(t), redisgate.Options{})
	const scope = "loss"
	long := func(s *gate.Source) { s.Breaker.Cooldown, s.Breaker.MaxCooldown = time.Hour, time.Hour }
	dead, ops := gatetest.Src("dead", long), gatetest.Src("ops", long)
	adm := admit(t, ctx, knows, scope, "p1", dead)
	settle(t, ctx, knows, scope, dead, adm.Permit, gate.VerdictForceOpen)
	must(knows.Override(ctx, gate.OverrideRequest{Scope: scope, Source: ops, Action: gate.ActionForceOpen, Actor: "alice", Why: "INC-42"}))(t)
	before := peek(t, ctx, knows, scope, dead).Breaker

	// refused checks that b grants neither source, and how.
	refused := func(t *testing.T, b *redisgate.Backend, id string) {
		t.Helper()
		for _, src := range []*gate.Source{dead, ops} {
			a := admit(t, ctx, b, scope, id+src.Name, src)
			if a.Granted || len(a.Rejections) != 1 {
				t.Fatalf("admit %s of %s after the loss: %+v, want refused", id, src.Name, a)
			}
			want := map[string]gate.Reason{"dead": gate.ReasonCircuitOpen, "ops": gate.ReasonForcedOpen}[src.Name]
			if r := a.Rejections[0]; r.Reason != want {
				t.Fatalf("admit %s of %s refused with %v, want %v", id, src.Name, r.Reason, want)
			}
		}
		d := peek(t, ctx, b, scope, dead).Breaker
		if d.State != gate.Open || d.Cause != gate.OpenCauseSourceDead || d.Reopens != before.Reopens ||
			d.RetryAfter <= 0 || d.RetryAfter > before.RetryAfter {
			t.Fatalf("dead after the loss: %+v; want OPEN by source_dead as before (%+v), no more cooldown left", d, before)
		}
	}

	t.Run("restart empty", func(t *testing.T) {
		srv.Stop()
		srv.Start()
		for i := range 10 {
			refused(t, knows, fmt.Sprint("k", i))
		}
		if l := knows.StateLoss(scope); l.Count != 1 || l.Restored != 2 || l.Pending || l.Last.IsZero() {
			t.Errorf("StateLoss = %+v, want one loss, 2 breakers restored, not pending", l)
		}
		refused(t, other, "o")
		if l := other.StateLoss(scope); l.Count != 0 {
			t.Errorf("the replica that never admitted before reports a loss: %+v", l)
		}
	})

	t.Run("another replica first", func(t *testing.T) {
		must(srv.Client(t).FlushAll(ctx).Result())(t)
		// fresh never saw the scope (nor heard of it): it finds the loss
		// first, re-asserts nothing, and grants.
		fresh := newBackend(t, srv.Client(t), redisgate.Options{})
		if a := admit(t, ctx, fresh, scope, "o1", dead); !a.Granted {
			t.Fatalf("other's admit after the flush: %+v, want granted (it never saw the OPEN)", a)
		} else {
			settle(t, ctx, fresh, scope, dead, a.Permit, gate.VerdictSuccess)
		}
		for i := range 10 {
			refused(t, knows, fmt.Sprint("k2-", i))
		}
		refused(t, other, "o2")
		if l := knows.StateLoss(scope); l.Count != 2 || l.Restored != 2 {
			t.Errorf("StateLoss = %+v, want a second loss, 2 breakers restored", l)
		}
	})
}
