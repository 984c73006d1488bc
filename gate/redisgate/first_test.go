package redisgate_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
)

// A settle run loads its source's state hash where the batch has not yet
// (BATCH_RUNS.first: the batch's first op of the source), so that the
// batch's first settle takes the early exit instead of walking to load it.

// TestBatchFirstOpRunEndsAtOnce: a batch whose first op is a settle that
// starts a run and does not take the exit (a failure, a permit holding no
// lease) walks, and the ops after it answer and store as the same ops one
// at a time. (Fails with BATCH_RUNS.flush taking its k 0, the run's end,
// for the op that raised where the run from the first op counted none:
// the batch fails, a count of a time that is none.)
func TestBatchFirstOpRunEndsAtOnce(t *testing.T) {
	for _, first := range []string{"failure", "ghost"} {
		t.Run(first, func(t *testing.T) {
			ctx := testCtx(t)
			clock := gatetest.NewClock()
			b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, "batched", "sequential")
			x := runsSource("x", 10*time.Second, 10*time.Second)
			x.Breaker.FailThreshold = 5 // (one failure does not trip it: the ops after it take the exit)
			t0 := clock.Now()
			run := func(scope string, batched bool) []string {
				clock.Set(t0)
				ps := map[string]gate.Permit{}
				for _, id := range []string{"h1", "h2", "h3"} {
					ps[id] = admit(t, ctx, b, scope, id, x).Permit
				}
				// x's window stored and its width set: a settle can take the exit
				settle(t, ctx, b, scope, x, admit(t, ctx, b, scope, "w0", x).Permit, gate.VerdictSuccess)
				clock.Advance(time.Millisecond)
				out := make([]string, 3)
				var fs []func()
				for i, id := range []string{"h1", "h2", "h3"} {
					fs = append(fs, func() {
						p, v := ps[id], gate.VerdictSuccess
						if i == 0 && first == "failure" {
							v = gate.VerdictFailure
						} else if i == 0 {
							p = gate.Permit{ID: "ghost"}
						}
						s, err := b.Settle(ctx, settleReq(scope, x, p, v))
						out[i] = fmt.Sprintf("%+v %v", s, err)
					})
				}
				runOps(t, b, h, scope, batched, fs)
				return out
			}
			seq, bat := run("sequential", false), run("batched", true)
			for i := range seq {
				if seq[i] != bat[i] {
					t.Errorf("op %d:\n batched       %s\n one at a time %s", i, bat[i], seq[i])
				}
			}
			sb, ss := storedScope(t, ctx, b, c, "batched", []string{"x"}), storedScope(t, ctx, b, c, "sequential", []string{"x"})
			for k, v := range ss {
				if sb[k] != v {
					t.Errorf("%s: batched %s, one at a time %s", k, sb[k], v)
				}
			}
		})
	}
}

// TestBatchFirstSettleRaisesByItsHeadFirst: the batch's first settle of a
// source whose argument is cut short fails with its own error, as the walk
// would (its head read before its state hash is loaded), even where the
// load would raise too (the hash a string: WRONGTYPE, every other op's
// error). (Fails with BATCH_RUNS.first loading before the op's SETTLE
// reads: the first op's error is WRONGTYPE.)
func TestBatchFirstSettleRaisesByItsHeadFirst(t *testing.T) {
	cut := &batchOpCutHook{k: 0, n: 3}
	out := firstSettles(t, 3, true, cut)
	if cut.on.Load() {
		t.Fatal("no op cut")
	}
	if !strings.Contains(out[0], "bad argument") {
		t.Errorf("the cut op: %s, want its own error", out[0])
	}
	for i := 1; i < len(out); i++ {
		if !strings.Contains(out[i], "WRONGTYPE") {
			t.Errorf("op %d: %s, want WRONGTYPE", i, out[i])
		}
	}
}

// firstSettles admits n permits of a source in a scope of their own, makes
// its state key a string when corrupt, adds hook to the client (a
// batchOpCutHook turned on), and settles the n as one batch: each one's
// error, as text ("<nil>" for none).
func firstSettles(t *testing.T, n int, corrupt bool, hook redis.Hook) []string {
	t.Helper()
	ctx := testCtx(t)
	const scope = "batched"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	x := runsSource("x", 10*time.Second, 10*time.Second)
	ps := make([]gate.Permit, n)
	for i := range ps {
		ps[i] = admit(t, ctx, b, scope, fmt.Sprint("h", i), x).Permit
	}
	if corrupt {
		key := b.SourceKey(scope, "x", "")
		if err := c.Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, key, "not a hash", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c.AddHook(hook)
	if cut, ok := hook.(*batchOpCutHook); ok {
		cut.on.Store(true)
	}
	out := make([]string, n)
	var fs []func()
	for i := range ps {
		fs = append(fs, func() {
			_, err := b.Settle(ctx, settleReq(scope, x, ps[i], gate.VerdictSuccess))
			out[i] = fmt.Sprint(err)
		})
	}
	runOps(t, b, h, scope, true, fs)
	return out
}

// TestBatchFirstAdmitBehindALineReadsNoState: a batch of admits alone
// whose first waits behind a line that is not empty loads its source's
// state hash no more than the walk does (BATCH_RUNS.admit_first tests the
// line first, as admit_run's exit: the walk refuses it in line, l_check,
// without reading the hash). The hash is a string here: a read would
// answer WRONGTYPE. (Fails with admit_first's line test dropped.)
func TestBatchFirstAdmitBehindALineReadsNoState(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batched"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
	waiter := func(id, place string) *gate.Waiter {
		return &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 8, Lease: time.Minute, Places: map[string]string{"s": place}}
	}
	admit(t, ctx, b, scope, "held", src) // the slot: full
	req := admitReq(scope, "a", src)
	req.Line = waiter("w1", "earlier") // in line
	if a, err := b.Admit(ctx, req); err != nil || a.Granted || len(a.Places) == 0 {
		t.Fatalf("w1: %+v %v, want refused with a place", a, err)
	}
	key := b.SourceKey(scope, "s", "")
	if err := c.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, key, "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	out := make([]string, 2)
	var fs []func()
	for i, id := range []string{"w2", "w3"} {
		fs = append(fs, func() {
			req := admitReq(scope, id, src)
			req.Line = waiter(id, "")
			a, err := b.Admit(ctx, req)
			out[i] = fmt.Sprint(a.Granted, " ", err)
		})
	}
	runOps(t, b, h, scope, true, fs)
	for i, o := range out {
		if o != "false <nil>" {
			t.Errorf("admit %d: %s, want refused in line without reading the state hash", i, o)
		}
	}
}
