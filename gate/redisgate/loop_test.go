package redisgate_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// cmdTimes records the (bubble) time of each command the client sends.
type cmdTimes struct {
	redistest.PassThrough
	mu    sync.Mutex
	start time.Time
	at    []time.Duration
	names []string
	stall time.Duration // the next pipeline (a marker check) waits this long first
}

func (r *cmdTimes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.add(cmd)
		return next(ctx, cmd)
	}
}
func (r *cmdTimes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			r.add(c)
		}
		r.mu.Lock()
		d := r.stall
		r.stall = 0
		r.mu.Unlock()
		time.Sleep(d)
		return next(ctx, cmds)
	}
}
func (r *cmdTimes) add(c redis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := c.Name()
	if (name == "get" || name == "fcall") && len(c.Args()) > 1 {
		name += " " + fmt.Sprint(c.Args()[1])
	}
	r.at = append(r.at, time.Since(r.start))
	r.names = append(r.names, name)
}

// since returns the commands recorded at or after d, as "time name".
func (r *cmdTimes) since(d time.Duration) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for i, at := range r.at {
		if at >= d {
			out = append(out, fmt.Sprintf("%v %s", at, r.names[i]))
		}
	}
	return out
}

// loopBubble runs f in a synctest bubble with a Backend on srv, its
// give-back loop started at every (after setup), and stops the loop after.
func loopBubble(t *testing.T, srv *redistest.Server, every time.Duration, timeout time.Duration, setup func(t *testing.T, ctx context.Context, b *redisgate.Backend), f func(t *testing.T, ctx context.Context, b *redisgate.Backend, c *redis.Client, rec *cmdTimes)) {
	synctest.Test(t, func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		defer c.Close()
		if err := c.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		rec := &cmdTimes{}
		c.AddHook(rec)
		b := newBackend(t, c, redisgate.Options{Timeout: timeout})
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		setup(t, ctx, b)
		done := make(chan struct{})
		rec.mu.Lock()
		rec.start, rec.at, rec.names = time.Now(), nil, nil // the setup's commands are not the loop's
		rec.mu.Unlock()
		go func() { b.RunGiveBacks(ctx, every); close(done) }()
		f(t, ctx, b, c, rec)
		stop()
		<-done // the loop ends with its ctx, whatever it slept for
	})
}

func forceOpenScope(t *testing.T, ctx context.Context, b *redisgate.Backend, scope string) {
	ops := gatetest.Src("ops")
	must(b.Override(ctx, gate.OverrideRequest{Scope: scope, Source: ops, Action: gate.ActionForceOpen, Actor: "a", Why: "w"}))(t)
	must(b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: "p1", Tokens: 1, Candidates: []gate.Candidate{{Source: ops, Ceiling: 1}}}))(t)
}

func markScope(t *testing.T, ctx context.Context, b *redisgate.Backend, scope string) {
	ops := gatetest.Src("ops")
	must(b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: "p1", Tokens: 1, Candidates: []gate.Candidate{{Source: ops, Ceiling: 1}}}))(t)
}

// A scope heard of from another replica (an OPEN breaker announced) is
// unmarked: heard just after an idle wake-up of the give-back loop, it is
// marked and re-asserted within one poll_interval, not at the next record
// check 4 poll_intervals later (the loop is woken to look again).
func TestHeardScopeReassertedWithinAPollInterval(t *testing.T) {
	srv := redistest.Start(t)
	const every = 50 * time.Millisecond
	loopBubble(t, srv, every, time.Second, func(t *testing.T, ctx context.Context, b *redisgate.Backend) { markScope(t, ctx, b, "s") },
		func(t *testing.T, ctx context.Context, b *redisgate.Backend, c *redis.Client, rec *cmdTimes) {
			time.Sleep(5*every + every/5) // just after the first record check
			synctest.Wait()
			heard := time.Since(rec.start)
			b.Hear("t", gate.Event{Kind: gate.EventTransition, Source: "ops", From: gate.Closed, To: gate.Open, Cooldown: time.Hour})
			time.Sleep(every)
			synctest.Wait()
			if n := c.Exists(ctx, "polygate:{t}:marker").Val(); n != 1 {
				time.Sleep(5 * every)
				synctest.Wait()
				t.Errorf("scope t heard of at %v (an OPEN breaker): not re-asserted one poll_interval (%v) later; commands since: %v", heard, every, rec.since(heard))
			}
		})
}

// While kicks keep coming at odd times (a give-back queued and Redis
// seen answering), the record checks stay on the 250 ms grid (none missed,
// none late) and the loss checks of a scope without records on the 20-tick
// grid.
func TestGiveBackLoopKeepsItsPaceUnderKicks(t *testing.T) {
	srv := redistest.Start(t)
	for _, gap := range []time.Duration{37 * time.Millisecond, time.Millisecond} {
		const every = 50 * time.Millisecond
		loopBubble(t, srv, every, time.Second, func(t *testing.T, ctx context.Context, b *redisgate.Backend) {
			forceOpenScope(t, ctx, b, "rec")
			markScope(t, ctx, b, "plain")
		}, func(t *testing.T, ctx context.Context, b *redisgate.Backend, c *redis.Client, rec *cmdTimes) {
			a := gatetest.Src("ops")
			for i := range int(3700 * time.Millisecond / gap) {
				time.Sleep(gap)
				b.DeferSettle(gate.SettleRequest{Scope: "rec", Source: a, PermitID: fmt.Sprint("k", i), ActualTokens: -1})
				_ = b.Ping(ctx) // pokes: the kick
			}
			synctest.Wait()
			end := time.Since(rec.start)
			var recAt, plainAt []time.Duration
			rec.mu.Lock()
			for i, n := range rec.names {
				switch n {
				case "get polygate:{rec}:marker":
					recAt = append(recAt, rec.at[i])
				case "get polygate:{plain}:marker":
					plainAt = append(plainAt, rec.at[i])
				}
			}
			rec.mu.Unlock()
			t.Logf("end %v, %d record checks, %d loss checks", end, len(recAt), len(plainAt))
			for k := range int(end / (5 * every)) {
				if k >= len(recAt) || recAt[k] != time.Duration(k+1)*5*every {
					t.Fatalf("record checks at %v; want every %v from %v", recAt, 5*every, 5*every)
				}
			}
			for k := range int(end / (20 * every)) {
				if k >= len(plainAt) || plainAt[k] != time.Duration(k+1)*20*every {
					t.Fatalf("loss checks at %v; want every %v", plainAt, 20*every)
				}
			}
		})
	}
}

// A marker lost (FLUSHALL, as a restart without persistence) at an odd
// time is re-asserted at the next record check for a scope with records,
// and at the next loss check for one without.
func TestLostMarkerReassertedAtTheNextCheck(t *testing.T) {
	srv := redistest.Start(t)
	const every = 50 * time.Millisecond
	loopBubble(t, srv, every, time.Second, func(t *testing.T, ctx context.Context, b *redisgate.Backend) {
		forceOpenScope(t, ctx, b, "rec")
		markScope(t, ctx, b, "plain")
	}, func(t *testing.T, ctx context.Context, b *redisgate.Backend, c *redis.Client, rec *cmdTimes) {
		time.Sleep(1234 * time.Millisecond)
		synctest.Wait()
		if err := c.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1250*time.Millisecond - 1234*time.Millisecond)
		synctest.Wait()
		if c.Exists(ctx, "polygate:{rec}:marker").Val() != 1 || b.StateLoss("rec").Count != 1 {
			t.Errorf("scope rec not re-asserted at the next record check: %+v", b.StateLoss("rec"))
		}
		time.Sleep(2*time.Second - 1250*time.Millisecond)
		synctest.Wait()
		if c.Exists(ctx, "polygate:{plain}:marker").Val() != 1 {
			t.Errorf("scope plain not re-marked at the next loss check; commands: %v", rec.since(1234*time.Millisecond))
		}
	})
}

// docs/redis.md: "a slot comes back within one poll_interval plus timeout of
// Redis's return". A give-back queued while the loop sleeps (an Admit's
// reply lost to a stall that ends at once, no call seeing Redis since) is
// tried within that, not at the next record check: with poll_interval 50 ms
// and timeout 100 ms (backend.redis.timeout allows 1 ms up), 150 ms, not
// 240.
func TestGiveBackWithinPollIntervalPlusTimeout(t *testing.T) {
	srv := redistest.Start(t)
	const every, timeout = 50 * time.Millisecond, 100 * time.Millisecond
	loopBubble(t, srv, every, timeout, func(t *testing.T, ctx context.Context, b *redisgate.Backend) { markScope(t, ctx, b, "s") },
		func(t *testing.T, ctx context.Context, b *redisgate.Backend, c *redis.Client, rec *cmdTimes) {
			time.Sleep(5*every + every/5)
			synctest.Wait()
			back := time.Since(rec.start) // the lost Admit's reply, and Redis answering again
			b.LoseAdmit(gate.AdmitRequest{Scope: "s", PermitID: "p2", Tokens: 1, Candidates: []gate.Candidate{{Source: gatetest.Src("ops"), Ceiling: 1}}})
			time.Sleep(every + timeout)
			synctest.Wait()
			if len(rec.since(back)) == 0 {
				time.Sleep(5 * every)
				synctest.Wait()
				t.Errorf("give-back queued at %v with Redis answering: not tried within poll_interval + timeout (%v); commands since: %v", back, every+timeout, rec.since(back))
			}
		})
}

// A marker check that takes longer than several ticks (a slow Redis,
// within the timeout) leaves the timer set in the past: it fires at once
// and the checks go on on the grid.
func TestGiveBackLoopGoesOnAfterASlowCheck(t *testing.T) {
	srv := redistest.Start(t)
	const every = 50 * time.Millisecond
	loopBubble(t, srv, every, time.Second, func(t *testing.T, ctx context.Context, b *redisgate.Backend) { forceOpenScope(t, ctx, b, "rec") },
		func(t *testing.T, ctx context.Context, b *redisgate.Backend, c *redis.Client, rec *cmdTimes) {
			rec.mu.Lock()
			rec.stall = 700 * time.Millisecond
			rec.mu.Unlock()
			time.Sleep(3 * time.Second)
			synctest.Wait()
			got := rec.since(0)
			t.Logf("%v", got)
			if len(got) < 8 {
				t.Errorf("checks after a slow one: %v", got)
			}
		})
}
