package redisgate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestGiveBackOfLostProbeEndsTheProbe: an Admit whose reply is lost while
// it took a HALF_OPEN breaker's probe (Redis stalled, the FCALL ran on
// resume) is given back without a verdict, as every lost Admit; the
// give-back is that probe's outcome and must end its lease ("every outcome
// of the probe ends its lease"), so that the next entrant probes. The
// give-back knows neither epoch nor probe flag: settled as stale, it leaves
// the probe held by nobody and the source refusing everyone
// (probe_in_flight) until the probe's TTL ends. The Backend's clock is a
// test clock that does not move, so the TTL never ends here.
func TestGiveBackOfLostProbeEndsTheProbe(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	clock := gatetest.NewClock()
	b := newBackend(t, c, redisgate.Options{Timeout: 100 * time.Millisecond, Clock: clock.Now})
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 10*time.Millisecond)

	const scope = "lost-probe"
	src := gatetest.Src("s", func(s *gate.Source) { s.Breaker.FailThreshold = 1 })
	eventually(t, ctx, "a first admission", func() bool {
		a, err := b.Admit(ctx, admitReq(scope, "warm", src))
		if err == nil && a.Granted {
			_, _ = b.Settle(ctx, settleReq(scope, src, a.Permit, gate.VerdictSuccess))
		}
		return err == nil
	})
	waitQueue(t, ctx, b)
	openBreaker(t, ctx, b, scope, src)
	clock.Advance(2 * src.Breaker.Cooldown)

	srv.Pause()
	_, err := b.Admit(ctx, admitReq(scope, "lost", src))
	srv.Resume()
	if !errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("Admit on a stalled Redis = %v, want gate.ErrUnavailable", err)
	}
	waitQueue(t, ctx, b)
	if v := peek(t, ctx, b, scope, src).Breaker; v.State != gate.HalfOpen {
		t.Fatalf("breaker after the stalled Admit ran: %+v, want HALF_OPEN (it took the probe)", v)
	}
	a := admit(t, ctx, b, scope, "next", src)
	if !a.Granted || !a.Permit.Probe {
		t.Fatalf("the next admit after the lost probe was given back: %+v, want granted as the probe", a)
	}
}
