package redisgate_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// waitQueue waits until the give-back queue is empty, or fails the test.
func waitQueue(t *testing.T, ctx context.Context, b *redisgate.Backend) {
	t.Helper()
	for b.GiveBacks().Queued > 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("give-back queue never emptied: %+v", b.GiveBacks())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func inFlight(t *testing.T, ctx context.Context, b *redisgate.Backend, scope string, srcs ...*gate.Source) []int {
	t.Helper()
	snap := must(b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: srcs}))(t)
	var out []int
	for _, v := range snap.Sources {
		out = append(out, v.Quota.InFlight)
	}
	return out
}

// An Admit whose reply is lost (Redis stalled past the Backend's timeout)
// still runs when Redis resumes, and grants a permit nobody holds: the
// Backend gives it back, on every candidate, once Redis answers again. A
// Settle whose reply is lost is repeated until Redis confirms it.
func TestGiveBacks(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	const timeout = 100 * time.Millisecond
	b := newBackend(t, c, redisgate.Options{Timeout: timeout})
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 10*time.Millisecond)

	a := gatetest.Src("a", func(s *gate.Source) { s.Limits.MaxConcurrency = 1; s.Limits.Lease = time.Hour })
	z := gatetest.Src("z", func(s *gate.Source) { s.Limits.MaxConcurrency = 1; s.Limits.Lease = time.Hour })
	cands := []gate.Candidate{{Source: a, Ceiling: 1}, {Source: z, Ceiling: 1}}

	// warm makes Redis load the library and b learn the scope's marker (a
	// first Admit of a scope takes three round trips, more than a loaded
	// machine may fit in the timeout: it is repeated until one answers),
	// and leaves nothing held or owed. It returns the give-backs' released
	// count then.
	warm := func(t *testing.T, scope string) uint64 {
		t.Helper()
		eventually(t, ctx, "a first admission in "+scope, func() bool {
			w, err := b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: "warm", Tokens: 1, Candidates: cands})
			if err == nil && w.Granted {
				_, _ = b.Settle(ctx, gate.SettleRequest{Scope: scope, Source: a, PermitID: "warm", Epoch: w.Permit.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1}) // or queued
			}
			return err == nil
		})
		waitQueue(t, ctx, b)
		return b.GiveBacks().Released
	}

	t.Run("lost admit", func(t *testing.T) {
		// Once Redis has the library, and the Backend the scope's marker,
		// the FCALL that queues up during the stall runs when it resumes.
		released := warm(t, "lost")
		srv.Pause()
		_, err := b.Admit(ctx, gate.AdmitRequest{Scope: "lost", PermitID: "p1", Tokens: 1, Candidates: cands})
		if !errors.Is(err, gate.ErrUnavailable) {
			srv.Resume()
			t.Fatalf("Admit on a stalled Redis = %v, want gate.ErrUnavailable", err)
		}
		if q := b.GiveBacks().Queued; q != 2 {
			t.Errorf("queued %d give-backs after a lost Admit of 2 candidates, want 2", q)
		}
		srv.Resume()
		waitQueue(t, ctx, b)
		if got := inFlight(t, ctx, b, "lost", a, z); got[0] != 0 || got[1] != 0 {
			t.Errorf("in flight after the give-back = %v, want [0 0]", got)
		}
		if g := b.GiveBacks(); g.Released-released != 1 {
			t.Errorf("give-backs %+v (released %d before): want the one permit the stalled Admit granted released", g, released)
		}
	})

	t.Run("lost settle", func(t *testing.T) {
		warm(t, "settle")
		adm := must(b.Admit(ctx, gate.AdmitRequest{Scope: "settle", PermitID: "p2", Tokens: 1, Candidates: cands}))(t)
		if !adm.Granted {
			t.Fatalf("Admit = %+v, want a grant", adm)
		}
		srv.Pause()
		_, err := b.Settle(ctx, gate.SettleRequest{Scope: "settle", Source: a, PermitID: "p2", Epoch: adm.Permit.Epoch,
			Verdict: gate.VerdictSuccess, ActualTokens: -1})
		srv.Resume()
		if !errors.Is(err, gate.ErrUnavailable) {
			t.Fatalf("Settle on a stalled Redis = %v, want gate.ErrUnavailable", err)
		}
		waitQueue(t, ctx, b)
		if got := inFlight(t, ctx, b, "settle", a); got[0] != 0 {
			t.Errorf("in flight after the repeated settle = %v, want [0]", got)
		}
	})
}

// The queue is bounded: a settle beyond it is counted, not kept.
func TestGiveBacksOverflow(t *testing.T) {
	srv := redistest.Start(t)
	b := newBackend(t, srv.Client(t), redisgate.Options{GiveBackQueue: 1})
	a := gatetest.Src("a")
	b.DeferSettle(gate.SettleRequest{Scope: "s", Source: a, PermitID: "p1", ActualTokens: -1})
	b.DeferSettle(gate.SettleRequest{Scope: "s", Source: a, PermitID: "p1", ActualTokens: -1}) // the same: kept once
	b.DeferSettle(gate.SettleRequest{Scope: "s", Source: a, PermitID: "p2", ActualTokens: -1})
	if g := b.GiveBacks(); g.Queued != 1 || g.Overflowed != 1 {
		t.Errorf("give-backs %+v: want 1 queued, 1 overflowed", g)
	}
}

// A Redis that comes back empty (FLUSHALL stands in for a restart without
// persistence) gets back, from the Backend's own record, the OPEN breaker
// and the override it had seen, with cooldown left, reopens, actor and
// reason; a Redis that kept its state gets nothing written.
func TestReassertAfterStateLoss(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	c := srv.Client(t)
	told := make(chan string, 10)
	b := newBackend(t, c, redisgate.Options{OnStateLoss: func(scope string, restored int) {
		told <- fmt.Sprintf("%s restored %d", scope, restored)
	}})
	dead := gatetest.Src("dead", func(s *gate.Source) { s.Breaker.Cooldown = time.Hour; s.Breaker.MaxCooldown = time.Hour })
	ops := gatetest.Src("ops")
	// The replica keeps the cooldown as it heard it, which is late by the
	// reply's latency, and re-asserts what is left when it sends (late by the
	// request's): both happen after start, so the cooldown re-asserted never
	// ends later than before's plus the test's time so far.
	start := time.Now()
	adm := must(b.Admit(ctx, gate.AdmitRequest{Scope: "s", PermitID: "p1", Tokens: 1, Candidates: []gate.Candidate{{Source: dead, Ceiling: 1}}}))(t)
	must(b.Settle(ctx, gate.SettleRequest{Scope: "s", Source: dead, PermitID: "p1", Epoch: adm.Permit.Epoch, Verdict: gate.VerdictForceOpen, ActualTokens: -1}))(t)
	must(b.Override(ctx, gate.OverrideRequest{Scope: "s", Source: ops, Action: gate.ActionForceOpen, Actor: "alice", Why: "INC-42"}))(t)

	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 10*time.Millisecond)
	view := func() (gate.SourceView, gate.SourceView) {
		snap := must(b.Peek(ctx, gate.PeekRequest{Scope: "s", Sources: []*gate.Source{dead, ops}}))(t)
		return snap.Sources[0], snap.Sources[1]
	}
	before, _ := view()
	// The first check of the scope finds it intact.
	eventually(t, ctx, "the scope's marker is set", func() bool { return c.Exists(ctx, "polygate:{s}:marker").Val() == 1 })
	if b.StateLosses() != 0 {
		t.Fatalf("a state loss reported while Redis kept everything: %s", <-told)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if got := <-told; got != "s restored 2" {
		t.Errorf("OnStateLoss told %q, want \"s restored 2\"", got)
	}
	d, o := view()
	if late := time.Since(start); d.Breaker.State != gate.Open || d.Breaker.Reopens != before.Breaker.Reopens || d.Breaker.Epoch != before.Breaker.Epoch ||
		d.Breaker.RetryAfter <= 0 || d.Breaker.RetryAfter > before.Breaker.RetryAfter+late {
		t.Errorf("dead after the loss: %+v; want OPEN as before (%+v), with no more cooldown left than that plus the test's %v", d.Breaker, before.Breaker, late)
	}
	if o.Breaker.Override != gate.ForcedOpen || o.Breaker.Actor != "alice" || o.Breaker.Why != "INC-42" {
		t.Errorf("ops after the loss: %+v; want FORCED_OPEN by alice (INC-42)", o.Breaker)
	}
}

func eventually(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: never happened", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// The background check of a scope whose marker holds is a GET of the
// marker, not a script run, even for a scope with an OPEN breaker to
// re-assert (checked at every tick); the script runs once Redis lost it.
func TestBackgroundCheckIsAGetWhileTheMarkerHolds(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	c := srv.Client(t)
	b := newBackend(t, c, redisgate.Options{})
	ops := gatetest.Src("ops")
	must(b.Override(ctx, gate.OverrideRequest{Scope: "s", Source: ops, Action: gate.ActionForceOpen, Actor: "alice", Why: "INC-42"}))(t)
	must(b.Admit(ctx, gate.AdmitRequest{Scope: "s", PermitID: "p1", Tokens: 1, Candidates: []gate.Candidate{{Source: ops, Ceiling: 1}}}))(t)

	scripts, gets := commandCalls(t, c, "fcall"), commandCalls(t, c, "get")
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 5*time.Millisecond)
	eventually(t, ctx, "ten background checks", func() bool { return commandCalls(t, c, "get") >= gets+10 })
	if n := commandCalls(t, c, "fcall") - scripts; n != 0 {
		t.Errorf("%d script calls while the marker held; want none (a GET per check)", n)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the override re-asserted", func() bool {
		snap := must(b.Peek(ctx, gate.PeekRequest{Scope: "s", Sources: []*gate.Source{ops}}))(t)
		return snap.Sources[0].Breaker.Override == gate.ForcedOpen
	})
}

// commandCalls is how many times the server ran the command (INFO
// commandstats).
func commandCalls(t *testing.T, c redis.UniversalClient, cmd string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
		if ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest+",", ',')], 10, 64)
			return n
		}
	}
	return 0
}

// The give-back loop wakes only at the ticks with work: while nothing is
// queued and every scope it knows is marked, at the next record check (or
// loss check, if sooner); at every tick while a scope is unmarked (heard of
// from another replica, not looked at yet) or a give-back is queued.
func TestGiveBackLoopSleepsUntilTicksWithWork(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	b := newBackend(t, srv.Client(t), redisgate.Options{Timeout: time.Second})
	idle := []struct{ tick, recordTicks, want uint64 }{
		{0, 5, 5}, {3, 5, 2}, {5, 5, 5}, // the record checks: every 5th tick
		{18, 8, 2}, // the loss check (every 20th) comes first
		{7, 1, 1},  // ticks further apart than the record check: every tick
	}
	check := func(when string, want func(tick, recordTicks uint64) uint64) {
		t.Helper()
		for _, c := range idle {
			if got := b.TicksToWork(c.tick, c.recordTicks); got != want(c.tick, c.recordTicks) {
				t.Errorf("%s: ticksToWork(%d, %d) = %d, want %d", when, c.tick, c.recordTicks, got, want(c.tick, c.recordTicks))
			}
		}
	}
	wantIdle := func(tick, recordTicks uint64) uint64 {
		for _, c := range idle {
			if c.tick == tick && c.recordTicks == recordTicks {
				return c.want
			}
		}
		panic("no case")
	}
	everyTick := func(uint64, uint64) uint64 { return 1 }
	check("no scope", wantIdle)

	ops := gatetest.Src("ops")
	b.Hear("s", gate.Event{Kind: gate.EventTransition, Source: "ops", From: gate.Closed, To: gate.Open})
	check("a scope heard of, unmarked", everyTick)
	must(b.Admit(ctx, gate.AdmitRequest{Scope: "s", PermitID: "p1", Tokens: 1, Candidates: []gate.Candidate{{Source: ops, Ceiling: 1}}}))(t)
	check("the scope marked by an admit", wantIdle)

	b.LoseAdmit(gate.AdmitRequest{Scope: "s", PermitID: "p2", Tokens: 1, Candidates: []gate.Candidate{{Source: ops, Ceiling: 1}}})
	check("a give-back queued", everyTick)
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 5*time.Millisecond)
	waitQueue(t, ctx, b)
	check("the give-back done", wantIdle)
}

// markerDown fails the pipelined GET of one scope's marker, as a Redis
// Cluster node that does not answer fails the calls of its slots.
type markerDown struct {
	redistest.PassThrough
	key string
}

func (h markerDown) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if c.Name() == "get" && len(c.Args()) > 1 && c.Args()[1] == h.key {
				down := errors.New("markerDown: i/o timeout")
				c.SetErr(down)
				err = down // a node's failure, not the others' redis.Nil, is what Exec answers
			}
		}
		return err
	}
}

// A background check whose marker reads fail for one scope (its Cluster
// node down) still finds the other scopes' losses and re-asserts them: a
// scope with an override that Redis lost gets it back while the other
// scope's marker cannot be read.
func TestBackgroundCheckGoesOnWhereMarkersAnswer(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	c := srv.Client(t)
	b := newBackend(t, c, redisgate.Options{Timeout: time.Second})
	ops := gatetest.Src("ops")
	for _, scope := range []string{"down", "up"} {
		must(b.Override(ctx, gate.OverrideRequest{Scope: scope, Source: ops, Action: gate.ActionForceOpen, Actor: "alice", Why: "INC-42"}))(t)
		must(b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: "p-" + scope, Tokens: 1, Candidates: []gate.Candidate{{Source: ops, Ceiling: 1}}}))(t)
	}
	c.AddHook(markerDown{key: "polygate:{down}:marker"})
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.RunGiveBacks(run, 5*time.Millisecond)
	eventually(t, ctx, "the override of the scope whose marker answers re-asserted", func() bool {
		snap := must(b.Peek(ctx, gate.PeekRequest{Scope: "up", Sources: []*gate.Source{ops}}))(t)
		return snap.Sources[0].Breaker.Override == gate.ForcedOpen
	})
}
