package redisgate_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
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
// and compares every answer (M3: one trace of operations, one trace of
// decisions).
func TestDifferential(t *testing.T) {
	memory := func(t *testing.T, clock *gatetest.Clock) gate.Backend { return inmem.New(clock.Now) }
	gatetest.Differential(t, 60, 400, memory, factory(redistest.Start(t).Client(t)))
}

// batchedBackend runs every Admit and Settle of the differential's traces
// through batch.lua (the write-back cache), not alone: behind a held lone
// call, after a stale settle of a permit nobody holds on each source the
// op touches (which changes no answer, but loads each source's breaker and
// window into the batch's cache first, so that the op itself reads and
// writes through it; and after it one more each, whose breaker views must
// be what Redis holds once the batch is written back).
type batchedBackend struct {
	*redisgate.Backend
	t *testing.T
	h *batchHook
	c *redis.Client
}

// batchedTTLs counts the hashes checked with an idle TTL and persisted.
var batchedTTLs [2]atomic.Int64

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
	seen := map[string]bool{}
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
	var uniq []*gate.Source
	for _, s := range srcs {
		if !seen[s.Name] {
			seen[s.Name] = true
			uniq = append(uniq, s)
			join(func() { _, _ = b.Backend.Settle(ctx, staleSettle(scope, s)) })
		}
	}
	join(op)
	// After the op, in the same batch, a stale settle of each source reads
	// its breaker from the cache (the view in its answer): once the batch
	// is written back, a Peek at the same time must see the same.
	after := make([]gate.Settlement, len(uniq))
	for i, s := range uniq {
		join(func() { after[i], _ = b.Backend.Settle(ctx, staleSettle(scope, s)) })
	}
	release()
	wg.Wait()
	for i, s := range uniq {
		v, err := b.Backend.Peek(ctx, gate.PeekRequest{Scope: scope, Sources: []*gate.Source{s}})
		if err != nil {
			b.t.Fatal(err)
		}
		got := v.Sources[0].Breaker
		if got != after[i].Breaker {
			b.t.Errorf("%s: the batch's cache had %+v, Redis after the flush %+v", s.Name, after[i].Breaker, got)
		}
		// The hash's TTL as b_save gives it: an idle TTL for a CLOSED
		// breaker without override, none otherwise.
		ttl, err := b.c.PTTL(ctx, b.SourceKey(scope, s.Name, "")).Result()
		if err != nil {
			b.t.Fatal(err)
		}
		closed := got.State == gate.Closed && got.Override == gate.NoOverride
		switch {
		case ttl > 0:
			batchedTTLs[0].Add(1)
		case ttl == -1:
			batchedTTLs[1].Add(1)
		}
		if ttl != -2 && (closed != (ttl > 0)) {
			b.t.Errorf("%s: %+v stored with PTTL %v", s.Name, got, ttl)
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

// TestDifferentialBatched: the differential suite (TestDifferential)
// replays its traces one op at a time, so that every op goes alone (admit,
// settle) and batch.lua with its write-back cache is never run by it. Here
// the same traces run with every Admit and Settle inside a batch (see
// batchedBackend), against the memory backend.
func TestDifferentialBatched(t *testing.T) {
	c := redistest.Start(t).Client(t)
	h := &batchHook{}
	c.AddHook(h)
	memory := func(t *testing.T, clock *gatetest.Clock) gate.Backend { return inmem.New(clock.Now) }
	batched := func(t *testing.T, clock *gatetest.Clock) gate.Backend {
		rb := factory(c)(t, clock).(*redisgate.Backend)
		rb.KeepArrivalOrder() // compared with the memory backend's ops in arrival order
		return batchedBackend{rb, t, h, c}
	}
	gatetest.Differential(t, 60, 100, memory, batched)
	calls := 0
	for _, n := range h.takeSizes() {
		if n > 1 {
			calls++
		}
	}
	if calls == 0 {
		t.Fatal("no batch call")
	}
	t.Logf("%d batch calls; checked %d hashes with a TTL, %d persisted", calls, batchedTTLs[0].Load(), batchedTTLs[1].Load())
}
