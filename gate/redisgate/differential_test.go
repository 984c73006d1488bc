package redisgate_test

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestDifferential replays random traces on the memory backend and on Redis
// and compares every answer: one trace of operations, one trace of
// decisions.
func TestDifferential(t *testing.T) {
	memory := func(t *testing.T, clock *gatetest.Clock) gate.Backend { return inmem.New(clock.Now) }
	gatetest.Differential(t, 60, 400, memory, factory(redistest.Start(t).Client(t)))
}

// batchedBackend runs every Admit and Settle of the differential's traces
// inside a call of several ops: behind a held call, after a stale settle
// (of a permit nobody holds, which changes no answer) of each source the
// op touches, so that the op reads and writes the records the call already
// read. After the call, each source's record must carry the TTL its
// breaker calls for.
type batchedBackend struct {
	*redisgate.Backend
	t *testing.T
	h *callHook
	c *redis.Client
}

func staleSettle(scope string, src *gate.Source) gate.SettleRequest {
	return gate.SettleRequest{Scope: scope, Source: src, PermitID: "t-nobody", Verdict: gate.VerdictNone, ActualTokens: -1}
}

func (b batchedBackend) inBatch(ctx context.Context, scope string, srcs []*gate.Source, op func()) {
	held, release := b.h.holdNext()
	starter := gatetest.Src("zz-starter")
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = b.Backend.Settle(ctx, staleSettle(scope, starter)) })
	<-held
	n := 0
	join := func(f func()) {
		wg.Go(f)
		n++
		deadline := time.Now().Add(30 * time.Second)
		for b.Gathering(scope) < n {
			if time.Now().After(deadline) {
				b.t.Fatalf("op %d not gathering", n)
			}
			runtime.Gosched()
		}
	}
	seen := map[string]bool{}
	var uniq []*gate.Source
	for _, s := range srcs {
		if !seen[s.Name] {
			seen[s.Name] = true
			uniq = append(uniq, s)
			join(func() { _, _ = b.Backend.Settle(ctx, staleSettle(scope, s)) })
		}
	}
	join(op)
	release()
	wg.Wait()
	for _, s := range uniq {
		v := must(b.Backend.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{s}}))(b.t).Sources[0].Breaker
		ttl := must(b.c.PTTL(ctx, b.SourceKey(scope, s.Name, "state")).Result())(b.t)
		closed := v.State == gate.Closed && v.Override == gate.NoOverride
		if ttl != -2 && (closed != (ttl > 0)) {
			b.t.Errorf("%s: %+v stored with PTTL %v", s.Name, v, ttl)
		}
	}
}

func (b batchedBackend) Admit(ctx context.Context, req gate.AdmitRequest) (a gate.Admission, err error) {
	var srcs []*gate.Source
	for _, c := range req.Candidates {
		srcs = append(srcs, c.Source)
	}
	b.inBatch(ctx, req.Scope, srcs, func() { a, err = b.Backend.Admit(ctx, req) })
	return a, err
}

func (b batchedBackend) Settle(ctx context.Context, req gate.SettleRequest) (s gate.Settlement, err error) {
	b.inBatch(ctx, req.Scope, []*gate.Source{req.Source}, func() { s, err = b.Backend.Settle(ctx, req) })
	return s, err
}

// TestDifferentialBatched replays the differential's traces with every
// Admit and Settle inside a call of several ops (batchedBackend).
func TestDifferentialBatched(t *testing.T) {
	c := redistest.Start(t).Client(t)
	h := &callHook{}
	c.AddHook(h)
	memory := func(t *testing.T, clock *gatetest.Clock) gate.Backend { return inmem.New(clock.Now) }
	batched := func(t *testing.T, clock *gatetest.Clock) gate.Backend {
		return batchedBackend{factory(c)(t, clock).(*redisgate.Backend), t, h, c}
	}
	gatetest.Differential(t, 60, 100, memory, batched)
	if !slices.ContainsFunc(h.takeSizes(), func(n int) bool { return n > 1 }) {
		t.Fatal("no call of several ops")
	}
}
