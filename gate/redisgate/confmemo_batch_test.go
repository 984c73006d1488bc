package redisgate_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
)

// TestBatchConfMemoSameAsSequential: batches in a row of one scope's same
// sources and configurations (the same CONF argument: the later batches
// take conf_open's memo of the first's SRC_CONF tables) answer and store
// the same as their ops one at a time, rounds of admits and of settles
// that count in the window (failures and successes: b_record, the
// breaker's trip and its cooldown, the slots freed and taken again). An op
// that wrote into a batch's shared SRC_CONF table, or kept a per-batch
// memo on it, would carry it into the next batch (review lua10r).
func TestBatchConfMemoSameAsSequential(t *testing.T) {
	ctx := testCtx(t)
	const seqScope, batScope = "memo-seq", "memo-bat"
	clock := gatetest.NewClock()
	b, h, c := batchFixture(t, redisgate.Options{Clock: clock.Now}, batScope)
	names := []string{"x", "y"}
	srcs := map[string]*gate.Source{}
	for i, n := range names {
		srcs[n] = gatetest.Src(n, func(s *gate.Source) {
			s.Limits.MaxConcurrency = 2 + i
			s.Limits.Lease = time.Hour
			s.Breaker.FailThreshold = 3
			s.Breaker.MinCalls = 2
			s.Breaker.FailRate = 0.5
			s.Breaker.Window = 20 * time.Second
			s.Breaker.Cooldown = 2 * time.Second
			s.Breaker.MaxCooldown = 4 * time.Second
		})
	}
	run := func(scope string, batched bool) []string {
		var out []string
		var held []gate.Permit // granted, not yet settled, in order
		for round := range 8 {
			// The settles of up to three permits the rounds before granted
			// (failures in the early rounds, then successes), then three
			// admits; each op's answer in its own slot.
			n := min(3, len(held))
			settling := held[:n]
			held = held[n:]
			admits := []string{"x", "y", "x"}
			res := make([]string, n+len(admits))
			granted := make([]gate.Permit, len(admits))
			var fs []func()
			for j, p := range settling {
				v := gate.VerdictFailure
				if round >= 4 || j == 2 {
					v = gate.VerdictSuccess
				}
				fs = append(fs, func() {
					s, err := b.Settle(ctx, settleReq(scope, srcs[p.Source], p, v))
					res[j] = fmt.Sprint("settle ", p.ID, " ", s.Released, s.Effect, s.Events, err)
				})
			}
			for k, name := range admits {
				id := fmt.Sprintf("r%d-%d", round, k)
				fs = append(fs, func() {
					a, err := b.Admit(ctx, admitReq(scope, id, srcs[name]))
					res[n+k] = fmt.Sprint("admit ", id, " ", a.Granted, a.Rejections, a.Events, err)
					if a.Granted {
						granted[k] = a.Permit
					}
				})
			}
			runOps(t, b, h, scope, batched, fs)
			for _, p := range granted {
				if p.ID != "" {
					held = append(held, p)
				}
			}
			out = append(out, res...)
			clock.Advance(1500 * time.Millisecond)
		}
		return out
	}
	start := clock.Now()
	seq := run(seqScope, false)
	clock.Set(start)
	bat := run(batScope, true)
	if len(seq) != len(bat) {
		t.Fatalf("%d answers batched, %d one at a time", len(bat), len(seq))
	}
	for i := range seq {
		if seq[i] != bat[i] {
			t.Errorf("%d:\n batched    %s\n one a time %s", i, bat[i], seq[i])
		}
	}
	gs, gb := storedScope(t, ctx, b, c, seqScope, names), storedScope(t, ctx, b, c, batScope, names)
	for k, v := range gs {
		if gb[k] != v {
			t.Errorf("%s:\n batched    %s\n one a time %s", k, gb[k], v)
		}
	}
}
