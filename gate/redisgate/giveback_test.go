package redisgate_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// stallFixture: a Backend with a short timeout over a redis-server the
// test can stall (SIGSTOP), its give-back loop running.
func stallFixture(t *testing.T) (*redistest.Server, *redisgate.Backend) {
	t.Helper()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	b := must(redisgate.New(c, redisgate.Options{Timeout: 200 * time.Millisecond}))(t)
	runGiveBacks(t, b)
	return srv, b
}

func oneSlot(name string) *gate.Source {
	return gatetest.Src(name, func(s *gate.Source) { s.Limits.MaxConcurrency = 1; s.Limits.Lease = time.Hour })
}

// TestGiveBackLostAdmit: an Admit whose reply is lost (Redis stalled past
// the timeout) still runs when Redis resumes and grants a permit nobody
// holds: it is given back once Redis answers again.
func TestGiveBackLostAdmit(t *testing.T) {
	srv, b := stallFixture(t)
	ctx := testCtx(t)
	a, z := oneSlot("a"), oneSlot("z")
	waitFor(t, func() bool { _, err := b.Admit(ctx, admitReq("lost", "warm", z)); return err == nil }, "a first admission")
	released := b.GiveBacks().Released
	srv.Pause()
	_, err := b.Admit(ctx, admitReq("lost", "p1", a, z))
	if !errors.Is(err, gate.ErrUnavailable) {
		srv.Resume()
		t.Fatalf("Admit on a stalled Redis: %v, want unavailable", err)
	}
	srv.Resume()
	// (Its caller was answered at the timeout; the call's own failure, or
	// its late reply, queues the give-back a moment later.)
	waitFor(t, func() bool { return b.GiveBacks().Released == released+1 }, "the stalled Admit's permit released")
	if n := inFlight(t, b, "lost", a); n != 0 {
		t.Errorf("in flight on a after the give-back: %d, want 0", n)
	}
}

// TestGiveBackBeforeTheAdmitRuns: a give-back that finds no slot held
// leaves a tombstone, so that the Admit, run later (a stalled Redis runs
// what its sockets queued when it resumes), grants nothing.
func TestGiveBackBeforeTheAdmitRuns(t *testing.T) {
	b, h, _ := batchFixture(t, redisgate.Options{Timeout: 200 * time.Millisecond})
	runGiveBacks(t, b)
	ctx := testCtx(t)
	a := oneSlot("a")
	warm(t, b, "tomb")
	h.failing(true) // the admit's call never reaches Redis
	if _, err := b.Admit(ctx, admitReq("tomb", "late", a)); !errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("admit: %v, want unavailable", err)
	}
	h.failing(false)
	waitFor(t, func() bool { return b.GiveBacks().Queued == 0 && b.GiveBacks().Confirmed > 0 }, "the give-back confirmed")
	if _, err := b.Admit(ctx, admitReq("tomb", "late", a)); err == nil {
		t.Fatal("the admit that ran after its give-back was answered, want an error")
	}
	if n := inFlight(t, b, "tomb", a); n != 0 {
		t.Fatalf("in flight %d after the late admit, want 0", n)
	}
}

// TestGiveBackLostSettle: a settle whose reply is lost is repeated until
// Redis confirms it.
func TestGiveBackLostSettle(t *testing.T) {
	srv, b := stallFixture(t)
	ctx := testCtx(t)
	a := oneSlot("a")
	var p gate.Permit
	waitFor(t, func() bool {
		adm, err := b.Admit(ctx, admitReq("settle", "p1", a))
		p = adm.Permit
		return err == nil && adm.Granted
	}, "a grant")
	srv.Pause()
	_, err := b.Settle(ctx, settleReq("settle", a, p, gate.VerdictSuccess))
	srv.Resume()
	if !errors.Is(err, gate.ErrUnavailable) {
		t.Fatalf("Settle on a stalled Redis: %v, want unavailable", err)
	}
	waitFor(t, func() bool { return b.GiveBacks().Queued == 0 && inFlight(t, b, "settle", a) == 0 }, "the settle repeated")
}

// TestGiveBacksOverflow: the queue is bounded; a settle beyond it is
// counted, not kept.
func TestGiveBacksOverflow(t *testing.T) {
	b := must(redisgate.New(redistest.Start(t).Client(t), redisgate.Options{GiveBackQueue: 1}))(t)
	a := gatetest.Src("a")
	for _, id := range []string{"p1", "p2"} {
		b.DeferSettle(gate.SettleRequest{Scope: "over", Source: a, PermitID: id, ActualTokens: -1})
	}
	if g := b.GiveBacks(); g.Queued != 1 || g.Overflowed != 1 {
		t.Fatalf("give-backs %+v, want 1 queued, 1 overflowed", g)
	}
	runGiveBacks(t, b)
	waitFor(t, func() bool { return b.GiveBacks().Queued == 0 }, "the queue drained")
}
