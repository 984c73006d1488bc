package redisgate_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// BenchmarkHeldAdmit measures the backend's side of taking a held call in
// on Redis, as make bench's held mode makes it: the Pick's Admit on a
// source forced open (refused, with the line's waiter as policy sends it),
// alone (serial) and in batches (parallel=64, with -cpu 1: 64 callers, as
// the held mode's 64 pickers), and the Peek OnNoRunnable reads before it
// holds the call. Its allocations (-benchmem) are garbage of each held call
// on Redis only (docs/performance.md, "What a held call costs"):
//
//	go test -run '^$' -bench HeldAdmit -benchmem -cpu 1 ./gate/redisgate/
func BenchmarkHeldAdmit(b *testing.B) {
	rb, err := redisgate.New(redistest.Start(b).Client(b), redisgate.Options{Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	src := gatetest.Src("only", func(s *gate.Source) { s.Limits.MaxConcurrency = 1000 })
	const scope = "held"
	if _, err := rb.Override(ctx, gate.OverrideRequest{Scope: scope, Source: src, Action: gate.ActionForceOpen, Actor: "bench", Why: "held calls"}); err != nil {
		b.Fatal(err)
	}
	var ids atomic.Int64
	// admit reports a wrong answer with Error, not Fatal: it also runs on
	// RunParallel's goroutines, where FailNow may not be called.
	admit := func(b *testing.B) {
		id := fmt.Sprint("c", ids.Add(1))
		a, err := rb.Admit(ctx, gate.AdmitRequest{
			Scope: scope, PermitID: "p" + id,
			Candidates: []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}},
			Line:       &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 64, Lease: time.Minute},
		})
		if err != nil || a.Granted || len(a.Rejections) != 1 {
			b.Errorf("Admit on a forced-open source: %+v %v", a, err)
		}
	}
	b.Run("admit/serial", func(b *testing.B) {
		for b.Loop() {
			admit(b)
		}
	})
	b.Run("admit/parallel=64", func(b *testing.B) {
		b.SetParallelism(64)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				admit(b)
			}
		})
	})
	b.Run("peek", func(b *testing.B) {
		req := gate.PeekRequest{Scope: scope, Sources: []*gate.Source{src}}
		for b.Loop() {
			if _, err := rb.Peek(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
