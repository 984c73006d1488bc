package redisgate_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestExitsSaveAsTheWalk: the early exits' inline saves (the TTL's mark, the
// copy for call_restore) store what the walk's b_save stores: an op that
// raises after an exit (call_restore) keeps the exit's lease count and
// window, and an exit's save an eighth of IdleTTL after the batch's first
// marks the TTL again, as one at a time (review lua9r: no test pinned
// either; written by the review).
func TestExitsSaveAsTheWalk(t *testing.T) {
	ctx := testCtx(t)
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now, IdleTTL: 8 * time.Second}, "warm")
	// While on, the batch's last op raises (its key map names a source the
	// batch lacks): call_restore runs after it.
	var on atomic.Bool
	c.AddHook(&lastBatchOpHook{on: &on, rewrite: mapTo99})
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 3; s.Limits.Lease = time.Minute })
	other := gatetest.Src("o")
	for _, tc := range []struct {
		name  string
		raise bool
		step  time.Duration
		admit bool
	}{
		{"admit-then-raise", true, 0, true},
		{"settle-then-raise", true, 0, false},
		{"admit-ttl-due", false, 1500 * time.Millisecond, true},
		{"settle-ttl-due", false, 1500 * time.Millisecond, false},
	} {
		start := clock.Now()
		run := func(scope string, batched bool) {
			clock.Set(start)
			f := &fastRun{t: t, ctx: ctx, be: b, clock: clock, scope: scope, src: src, ps: map[string]gate.Permit{}, keep: true}
			settle(t, ctx, b, scope, other, admit(t, ctx, b, scope, "w", other).Permit, gate.VerdictSuccess)
			f.admit("a")
			clock.Advance(2 * time.Second)
			fs := []func(){func() { _, _ = b.Settle(ctx, staleSettle(scope, src)) }}
			fs = append(fs, func() {
				clock.Advance(tc.step)
				if tc.admit {
					f.admit("b")
				} else {
					f.settle("a", gate.VerdictSuccess)
				}
			})
			if batched && tc.raise {
				fs = append(fs, func() { _, _ = b.Admit(ctx, admitReq(scope, "z", src)) })
				on.Store(true)
			}
			runOps(t, b, h, scope, batched, fs)
			on.Store(false)
		}
		run("seq-"+tc.name, false)
		run("bat-"+tc.name, true)
		got, want := storedScope(t, ctx, b, c, "bat-"+tc.name, []string{"s"}), storedScope(t, ctx, b, c, "seq-"+tc.name, []string{"s"})
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s %s:\n batched       %s\n one at a time %s", tc.name, k, got[k], v)
			}
		}
		clock.Advance(time.Hour)
	}
}

// TestSettleArgMissingBlockRefused: a settle's argument without its
// HANDOFF block is refused naming the blocks, not read from the bytes of
// its position table.
func TestSettleArgMissingBlockRefused(t *testing.T) {
	ctx := testCtx(t)
	c := redistest.Start(t).Client(t)
	b := newBackend(t, c, redisgate.Options{})
	src := gatetest.Src("s")
	p := admit(t, ctx, b, "oparg", "p", src).Permit
	c.AddHook(&opArgHook{fn: "_settle", keep: 1})
	_, err := b.Settle(ctx, settleReq("oparg", src, p, gate.VerdictSuccess))
	if err == nil || !strings.Contains(err.Error(), "an op argument of 1 blocks, want 2") {
		t.Fatalf("a settle without its HANDOFF block: %v, want the blocks named", err)
	}
}
