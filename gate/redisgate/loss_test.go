package redisgate_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// lossFixture: one redis-server and n Backends sharing it.
func lossFixture(t *testing.T, n int) (*redis.Client, []*redisgate.Backend) {
	t.Helper()
	c := redistest.Start(t).Client(t)
	bs := make([]*redisgate.Backend, n)
	for i := range bs {
		bs[i] = must(redisgate.New(c, redisgate.Options{}))(t)
	}
	return c, bs
}

func settleReq(scope string, src *gate.Source, p gate.Permit, v gate.Verdict) gate.SettleRequest {
	return gate.SettleRequest{Scope: scope, Source: src, PermitID: p.ID, Epoch: p.Epoch, Probe: p.Probe, Verdict: v, ActualTokens: -1, Progress: v == gate.VerdictSuccess}
}

// deadAndForced opens a with SOURCE_DEAD and forces b open through k.
func deadAndForced(t *testing.T, k *redisgate.Backend, scope string, a, b *gate.Source) {
	t.Helper()
	ctx := testCtx(t)
	p := must(k.Admit(ctx, admitReq(scope, "dead", a)))(t)
	if !p.Granted {
		t.Fatalf("a refused: %+v", p.Rejections)
	}
	must(k.Settle(ctx, settleReq(scope, a, p.Permit, gate.VerdictForceOpen)))(t)
	must(k.Override(ctx, gate.OverrideRequest{Scope: scope, Source: b, Action: gate.ActionForceOpen, Actor: "alice", Why: "key rotation"}))(t)
}

// refusedEvery admits each source alone n times through k and fails the
// test at the first grant.
func refusedEvery(t *testing.T, k *redisgate.Backend, scope string, n int, srcs ...*gate.Source) {
	t.Helper()
	ctx := testCtx(t)
	for i := range n {
		for _, s := range srcs {
			a := must(k.Admit(ctx, admitReq(scope, "try-"+s.Name+"-"+string(rune('a'+i%26))+time.Now().Format("150405.000000000"), s)))(t)
			if a.Granted {
				t.Fatalf("admit %d of %s granted after the loss", i, s.Name)
			}
		}
	}
}

// TestReassertOwnAfterLoss: a Backend that opened a breaker and forced
// another never grants either after Redis loses the scope, and reports the
// loss.
func TestReassertOwnAfterLoss(t *testing.T) {
	c, bs := lossFixture(t, 1)
	k := bs[0]
	ctx := testCtx(t)
	a, b := gatetest.Src("a"), gatetest.Src("b")
	deadAndForced(t, k, "own", a, b)
	must(c.FlushAll(ctx).Result())(t)
	refusedEvery(t, k, "own", 50, a, b)
	l := k.StateLoss("own")
	if l.Count != 1 || l.Restored != 2 || l.Pending || k.StateLosses() != 1 {
		t.Fatalf("state loss %+v (total %d), want one loss, 2 re-asserted", l, k.StateLosses())
	}
	v := must(k.Peek(ctx, gate.PeekRequest{Scope: "own", Sources: []*gate.Source{a, b}}))(t)
	if got := v.Sources[0].Breaker; got.State != gate.Open || got.Cause != gate.OpenCauseSourceDead {
		t.Errorf("a after the loss: %+v, want OPEN by source_dead", got)
	}
	if got := v.Sources[1].Breaker; got.Override != gate.ForcedOpen || got.Actor != "alice" || got.Why != "key rotation" {
		t.Errorf("b after the loss: %+v, want forced open by alice", got)
	}
}

// TestReadOfALostScopeForgetsNothing: reads and settles of a scope Redis
// lost, before the re-assert, show its breakers CLOSED; the Backend still
// re-asserts what it saw before, and grants neither source.
func TestReadOfALostScopeForgetsNothing(t *testing.T) {
	c, bs := lossFixture(t, 1)
	k := bs[0]
	ctx := testCtx(t)
	a, b, other := gatetest.Src("a"), gatetest.Src("b"), gatetest.Src("other")
	p := must(k.Admit(ctx, admitReq("read", "held", other)))(t)
	deadAndForced(t, k, "read", a, b)
	must(c.FlushAll(ctx).Result())(t)
	must(k.Peek(ctx, gate.PeekRequest{Scope: "read", Sources: []*gate.Source{a, b}}))(t)
	must(k.Settle(ctx, settleReq("read", a, p.Permit, gate.VerdictSuccess)))(t)
	refusedEvery(t, k, "read", 20, a, b)
}

// TestReassertWhatWasSeen: a replica re-asserts what it only saw (its
// admits refused by another replica's dead-key OPEN and override) after
// the replica that set them is gone and Redis restarts empty; it grants
// neither source, not once, and its reads show both.
func TestReassertWhatWasSeen(t *testing.T) {
	c, bs := lossFixture(t, 2)
	k1, k2 := bs[0], bs[1]
	ctx := testCtx(t)
	a, b := gatetest.Src("a"), gatetest.Src("b")
	warm(t, k2, "seen")
	deadAndForced(t, k1, "seen", a, b)
	refusedEvery(t, k2, "seen", 1, a, b) // k2 sees both refused
	must(c.FlushAll(ctx).Result())(t)    // k1 is gone: only k2 knows
	refusedEvery(t, k2, "seen", 200, a, b)
	v := must(k2.Peek(ctx, gate.PeekRequest{Scope: "seen", Sources: []*gate.Source{a, b}}))(t)
	if v.Sources[0].Breaker.State != gate.Open || v.Sources[1].Breaker.Override != gate.ForcedOpen {
		t.Fatalf("after the loss: %+v", v.Sources)
	}
}

// TestReassertWhatWasHeard: a replica that only heard another's
// announcements (no admit of its own) re-asserts them in the background
// within checkEvery of the loss.
func TestReassertWhatWasHeard(t *testing.T) {
	c, bs := lossFixture(t, 2)
	k1, k2 := bs[0], bs[1]
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	heard := make(chan struct{}, 16)
	go func() { _ = k2.Subscribe(ctx, func(string, gate.Event) { heard <- struct{}{} }) }()
	runGiveBacks(t, k2)
	a, b := gatetest.Src("a"), gatetest.Src("b")
	waitFor(t, func() bool {
		_ = must(k1.Override(ctx, gate.OverrideRequest{Scope: "heard", Source: a, Action: gate.ActionClear, Actor: "t", Why: "subscribed?"}))(t)
		select {
		case <-heard:
			return true
		default:
			return false
		}
	}, "k2 subscribed")
	deadAndForced(t, k1, "heard", a, b)
	waitFor(t, func() bool { return len(k2.Records()) == 2 }, "k2 remembering both")
	must(c.FlushAll(ctx).Result())(t)
	waitFor(t, func() bool {
		v := must(k1.Peek(ctx, gate.PeekRequest{Scope: "heard", Sources: []*gate.Source{a, b}}))(t)
		return v.Sources[0].Breaker.State == gate.Open && v.Sources[1].Breaker.Override == gate.ForcedOpen
	}, "k2 re-asserting both in the background")
	if l := k2.StateLoss("heard"); l.Count != 1 || l.Restored != 2 {
		t.Fatalf("k2's state loss %+v", l)
	}
}

// TestNoLossWhereRedisKeptTheScope: an override cleared on Redis while the
// scope's marker held is never re-asserted, and a first look at a scope is
// no loss.
func TestNoLossWhereRedisKeptTheScope(t *testing.T) {
	_, bs := lossFixture(t, 2)
	k1, k2 := bs[0], bs[1]
	ctx := testCtx(t)
	a := gatetest.Src("a")
	must(k1.Override(ctx, gate.OverrideRequest{Scope: "kept", Source: a, Action: gate.ActionForceOpen, Actor: "t", Why: "w"}))(t)
	warm(t, k1, "kept")
	refusedEvery(t, k1, "kept", 1, a)
	must(k2.Override(ctx, gate.OverrideRequest{Scope: "kept", Source: a, Action: gate.ActionClear, Actor: "t", Why: "w"}))(t)
	if got := must(k1.Admit(ctx, admitReq("kept", "after-clear", a)))(t); !got.Granted {
		t.Fatalf("after the clear: %+v", got.Rejections)
	}
	if k1.StateLosses()+k2.StateLosses() != 0 {
		t.Fatalf("losses %d, %d; want none", k1.StateLosses(), k2.StateLosses())
	}
}
