package redisgate_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
)

// TestBatchAdmitExitRaisesAsTheWalk: a batch admit of one candidate whose
// SRC_CONF number and key map are both out of range (a caller that lies
// about both) fails with the walk's error, the one a walk raises first
// (its candidate's configuration), not another: the early exit looks its
// source up only where the walk would (review of the lua7 branch).
func TestBatchAdmitExitRaisesAsTheWalk(t *testing.T) {
	ctx := testCtx(t)
	const scope = "batch-exit-raise"
	b, h, c := batchFixture(t, redisgate.Options{}, scope)
	c.AddHook(&confHook{fn: "_batch"})
	c.AddHook(&batchMapHook{})
	s1, s2 := gatetest.Src("s1"), gatetest.Src("s2")
	var errs [2]error
	release, wait := gather(t, b, h, scope, 2,
		func() { _, errs[0] = b.Admit(ctx, admitReq(scope, "p1", s1)) },
		func() { _, errs[1] = b.Admit(ctx, admitReq(scope, "p2", s2)) },
	)
	release()
	wait()
	for i, err := range errs {
		if want := fmt.Sprintf("an op names source configuration %d of 0", i+1); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("admit %d: %v, want the missing configuration named (the walk's first error)", i+1, err)
		}
	}
	v, err := b.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{s1, s2}})
	if err != nil || v.Sources[0].Quota.InFlight != 0 || v.Sources[1].Quota.InFlight != 0 {
		t.Fatalf("after the refused batch: %+v %v, want no lease", v, err)
	}
}
