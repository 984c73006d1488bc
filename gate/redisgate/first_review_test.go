package redisgate_test

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/redisgate"
)

// TestBatchFirstSettleBadPositionTableRaisesAsTheWalk (review lua12r): the
// batch's first settle of a source whose position table names a SETTLE
// block past the argument's end fails with the walk's error (op_check's,
// naming the blocks), not the unpack's: BATCH_RUNS.first reads SETTLE only
// where at == p0 + 8. (Fails with first's `at ~= p0 + 8` test dropped.)
func TestBatchFirstSettleBadPositionTableRaisesAsTheWalk(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batched"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	x := runsSource("x", 10*time.Second, 10*time.Second)
	ps := make([]gate.Permit, 2)
	for i := range ps {
		ps[i] = admit(t, ctx, b, scope, fmt.Sprint("h", i), x).Permit
	}
	cut := &batchOpCutHook{k: 0, n: 2, rewrite: func(op []byte, p0 int) []byte {
		binary.LittleEndian.PutUint32(op[p0:], 4000) // SETTLE's position: past the end
		return op
	}}
	c.AddHook(cut)
	cut.on.Store(true)
	out := make([]string, 2)
	var fs []func()
	for i := range ps {
		fs = append(fs, func() {
			_, err := b.Settle(ctx, settleReq(scope, x, ps[i], gate.VerdictSuccess))
			out[i] = fmt.Sprint(err)
		})
	}
	runOps(t, b, h, scope, true, fs)
	if cut.on.Load() {
		t.Fatal("no op rewritten")
	}
	if !strings.Contains(out[0], "an op argument of 1000 blocks, want 2") {
		t.Errorf("the rewritten op: %s, want op_check's error", out[0])
	}
	if out[1] != "<nil>" {
		t.Errorf("op 1: %s, want settled", out[1])
	}
}

// TestBatchFirstSettleWithoutItsConfRaisesAsTheWalk (review lua12r): the
// batch's first settle of a source whose SRC_CONF number is out of range
// (a caller that lies) fails with the walk's error, naming the missing
// configuration, before its state hash is read: the hash is a string
// here, a read would answer WRONGTYPE. (Fails with settle_run loading the
// hash, BATCH_RUNS.first, without its configuration: `pc` dropped from
// its test.)
func TestBatchFirstSettleWithoutItsConfRaisesAsTheWalk(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batched"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	x := runsSource("x", 10*time.Second, 10*time.Second)
	ps := make([]gate.Permit, 2)
	for i := range ps {
		ps[i] = admit(t, ctx, b, scope, fmt.Sprint("h", i), x).Permit
	}
	key := b.SourceKey(scope, "x", "")
	if err := c.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, key, "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	c.AddHook(&confHook{fn: "_batch"})
	errs := make([]error, 2)
	var fs []func()
	for i := range ps {
		fs = append(fs, func() { _, errs[i] = b.Settle(ctx, settleReq(scope, x, ps[i], gate.VerdictSuccess)) })
	}
	runOps(t, b, h, scope, true, fs)
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "an op names source configuration 1 of 0") {
			t.Errorf("settle %d: %v, want the missing configuration named (the walk's first error)", i, err)
		}
	}
}
