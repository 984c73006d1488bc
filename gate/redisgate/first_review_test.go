package redisgate_test

import (
	"encoding/binary"
	"strings"
	"testing"
)

// TestBatchFirstSettleBadPositionTableRaisesAsTheWalk (review lua12r): the
// batch's first settle of a source whose position table names a SETTLE
// block past the argument's end fails with the walk's error (op_check's,
// naming the blocks), not the unpack's: BATCH_RUNS.first reads SETTLE only
// where at == p0 + 8. (Fails with first's `at ~= p0 + 8` test dropped.)
func TestBatchFirstSettleBadPositionTableRaisesAsTheWalk(t *testing.T) {
	cut := &batchOpCutHook{k: 0, n: 2, rewrite: func(op []byte, p0 int) []byte {
		binary.LittleEndian.PutUint32(op[p0:], 4000) // SETTLE's position: past the end
		return op
	}}
	out := firstSettles(t, 2, false, cut)
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
	for i, err := range firstSettles(t, 2, true, &confHook{fn: "_batch"}) {
		if !strings.Contains(err, "an op names source configuration 1 of 0") {
			t.Errorf("settle %d: %s, want the missing configuration named (the walk's first error)", i, err)
		}
	}
}
