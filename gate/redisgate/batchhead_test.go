package redisgate_test

import (
	"strings"
	"testing"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
)

// TestBatchOpHeadShortFailsTheBatch: an op whose head does not read fails
// the batch as a whole (the call raises: every op of it answers with the
// call's error), not the op alone, though the ops before it ran (batch.lua's
// batch_run, its one pcall around the ops: st[1] tells an op's head from
// its body).
func TestBatchOpHeadShortFailsTheBatch(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-head"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	// The last op's argument cut to nothing: its head (BATCH_OP) does not read.
	c.AddHook(&lastBatchOpHook{rewrite: func([]byte) []byte { return []byte{} }})
	s1, s2 := gatetest.Src("s1"), gatetest.Src("s2")
	var errs [2]error
	release, wait := gather(t, b, h, scope, 2,
		func() { _, errs[0] = b.Admit(ctx, admitReq(scope, "p1", s1)) },
		func() { _, errs[1] = b.Admit(ctx, admitReq(scope, "p2", s2)) },
	)
	release()
	wait()
	for i, err := range errs {
		// (the call's error, as Redis gives it for a function that raised;
		// an op's own error is its message alone)
		if err == nil || !strings.Contains(err.Error(), "bad argument") || !strings.Contains(err.Error(), "_batch, on @user_function") {
			t.Errorf("admit %d: %v, want the batch's error", i+1, err)
		}
	}
	if sizes := h.takeSizes(); len(sizes) != 2 || sizes[1] != 2 {
		t.Fatalf("batch sizes %v, want [1 2]", sizes)
	}
	v, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{s2}})
	if err != nil || v.Sources[0].Quota.InFlight != 0 {
		t.Fatalf("after the refused batch: %+v %v, want no lease on s2", v, err)
	}
}
