package redisgate_test

import (
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestTTL: every key expires once it is no longer needed, except the record
// of a breaker that is OPEN, HALF_OPEN or overridden, which must never
// expire into a fresh CLOSED one.
func TestTTL(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	clock := gatetest.NewClock()
	b := newBackend(t, c, redisgate.Options{Clock: clock.Now, IdleTTL: time.Hour})
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.RPM = 100; s.Limits.Lease = 10 * time.Second })
	const scope = "ttl"
	key := func(k string) string { return b.SourceKey(scope, "s", k) }
	pttl := func(k string) time.Duration {
		t.Helper()
		return must(c.PTTL(ctx, k).Result())(t)
	}
	// within: the key expires, after at most max.
	within := func(what, k string, max time.Duration) {
		t.Helper()
		if d := pttl(k); d <= 0 || d > max {
			t.Fatalf("%s: PTTL %s = %v, want in (0, %v]", what, k, d, max)
		}
	}
	persisted := func(what string) {
		t.Helper()
		if d := pttl(key("state")); d != -1 {
			t.Fatalf("%s: breaker PTTL = %v, want none (persisted)", what, d)
		}
	}

	p := admit(t, ctx, b, scope, "p1", src).Permit
	within("closed breaker holding a lease", key("state"), time.Hour)
	within("minute log", key("minute"), time.Minute+time.Second)
	within("minute tokens", key("tokens"), time.Minute+time.Second)
	settle(t, ctx, b, scope, src, p, gate.VerdictSuccess)
	within("closed breaker that counted an outcome", key("state"), time.Hour)
	within("progress", b.ScopeKey(scope, "progress"), time.Hour)

	admit(t, ctx, b, scope, "held", src) // holds a lease through what follows
	openBreaker(t, ctx, b, scope, src)
	persisted("open")

	// The minute's keys expiring (here: deleted) leave the breaker as it was.
	before := peek(t, ctx, b, scope, src)
	if n := must(c.Del(ctx, key("minute"), key("tokens")).Result())(t); n != 2 {
		t.Fatalf("deleted %d quota keys, want 2", n)
	}
	after := peek(t, ctx, b, scope, src)
	if after.Breaker != before.Breaker || after.Breaker.State != gate.Open {
		t.Fatalf("breaker after losing the quota keys: %+v, before %+v", after.Breaker, before.Breaker)
	}
	if r := admit(t, ctx, b, scope, "p2", src); r.Granted || r.Rejections[0].Reason != gate.ReasonCircuitOpen ||
		r.Rejections[0].RetryAfter != before.Breaker.RetryAfter {
		t.Fatalf("admission after losing the quota keys: %+v", r)
	}

	clock.Advance(before.Breaker.RetryAfter)
	probe := admit(t, ctx, b, scope, "probe", src).Permit
	if !probe.Probe {
		t.Fatalf("no probe after the cooldown: %+v", probe)
	}
	persisted("half open with the probe out")
	settle(t, ctx, b, scope, src, probe, gate.VerdictSuccess)
	within("closed again by the probe", key("state"), time.Hour)

	must(b.Override(ctx, gate.OverrideRequest{Scope: scope, Source: src, Action: gate.ActionForceClosed, Actor: "op"}))(t)
	persisted("closed with an override")
	must(b.Override(ctx, gate.OverrideRequest{Scope: scope, Source: src, Action: gate.ActionClear, Actor: "op"}))(t)
	within("override cleared", key("state"), time.Hour)
}
