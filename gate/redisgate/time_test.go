package redisgate_test

import (
	"context"
	"encoding/binary"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

func serverTime(t testing.TB, ctx context.Context, c redis.UniversalClient) int64 {
	t.Helper()
	return must(c.Time(ctx).Result())(t).UnixMilli()
}

// headerNows returns the "now" of the header of every call recorded.
func headerNows(t testing.TB, h *redistest.Recorder) []int64 {
	t.Helper()
	var out []int64
	names, args := h.Take()
	for i, n := range names {
		if n != "fcall" {
			continue
		}
		nkeys := args[i][2].(int)
		head := args[i][3+nkeys].([]byte) // the header's numbers, now first
		now := int64(math.Float64frombits(binary.LittleEndian.Uint64(head)))
		out = append(out, now)
	}
	return out
}

// TestProductionUsesServerTime: without Options.Clock every call says now
// is 0, so no clock of this process reaches a decision: the script uses the
// server's TIME, and another Backend reads retry_after as the cooldown less
// the server time elapsed since.
func TestProductionUsesServerTime(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	hook := &redistest.Recorder{}
	ca, cb := srv.Client(t), srv.Client(t)
	ca.AddHook(hook)
	cb.AddHook(hook)
	a := newBackend(t, ca, redisgate.Options{})
	b := newBackend(t, cb, redisgate.Options{})
	src := gatetest.Src("s", func(s *gate.Source) {
		s.Breaker.FailThreshold = 1
		s.Breaker.Cooldown = time.Minute
		s.Breaker.MaxCooldown = time.Hour
	})
	const scope = "time"
	p := admit(t, ctx, a, scope, "p1", src).Permit
	before := serverTime(t, ctx, ca)
	s := settle(t, ctx, a, scope, src, p, gate.VerdictFailure)
	if s.Breaker.State != gate.Open || s.Breaker.RetryAfter != time.Minute {
		t.Fatalf("opening: %+v, want open for exactly the cooldown", s.Breaker)
	}
	v := peek(t, ctx, b, scope, src).Breaker
	end := serverTime(t, ctx, cb)
	lo, hi := time.Minute-time.Duration(end-before)*time.Millisecond, time.Minute
	if v.Reason != gate.ReasonCircuitOpen || v.RetryAfter < lo || v.RetryAfter > hi {
		t.Fatalf("other backend: %+v, want circuit_open with retry_after in [%v, %v]", v, lo, hi)
	}
	nows := headerNows(t, hook)
	if len(nows) < 4 || slices.ContainsFunc(nows, func(n int64) bool { return n != 0 }) {
		t.Fatalf("calls said now = %v, want 0 (the server's TIME) in each", nows)
	}
}

// TestTestClockIsSent: with Options.Clock every call carries its time.
func TestTestClockIsSent(t *testing.T) {
	ctx := testCtx(t)
	hook := &redistest.Recorder{}
	c := redistest.Start(t).Client(t)
	c.AddHook(hook)
	clock := gatetest.NewClock()
	b := newBackend(t, c, redisgate.Options{Clock: clock.Now})
	src := gatetest.Src("s")
	admit(t, ctx, b, "clock", "p1", src)
	clock.Advance(1500 * time.Microsecond)
	peek(t, ctx, b, "clock", src)
	want := []int64{gatetest.Epoch.UnixMilli(), gatetest.Epoch.UnixMilli() + 1}
	if got := slices.Compact(headerNows(t, hook)); !slices.Equal(got, want) {
		t.Fatalf("now sent %v, want %v", got, want)
	}
}
