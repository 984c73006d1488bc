package redisgate_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// BenchmarkAttemptCycle measures one attempt at the backend seam (Admit on
// one source, then Settle as a success) on the memory backend and on a
// loopback redis-server in production mode (TIME), serial and parallel:
//
//	go test -run '^$' -bench AttemptCycle -benchmem ./gate/redisgate/
func BenchmarkAttemptCycle(b *testing.B) {
	srv := redistest.Start(b)
	rb, err := redisgate.New(srv.Client(b), redisgate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1_000_000; s.Limits.RPM = 100_000_000 })
	var ids atomic.Int64
	cycle := func(b *testing.B, ctx context.Context, g gate.Backend, scope string) {
		a, err := g.Admit(ctx, gate.AdmitRequest{
			Scope: scope, PermitID: fmt.Sprint("p", ids.Add(1)), Tokens: 10,
			Candidates: []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}},
		})
		if err != nil || !a.Granted {
			b.Fatalf("Admit: %+v %v", a, err)
		}
		if _, err := g.Settle(ctx, gate.SettleRequest{
			Scope: scope, Source: src, PermitID: a.Permit.ID, Epoch: a.Permit.Epoch,
			Verdict: gate.VerdictSuccess, ActualTokens: 12, Progress: true,
		}); err != nil {
			b.Fatal(err)
		}
	}
	for _, be := range []struct {
		name string
		g    gate.Backend
	}{{"memory", inmem.New(nil)}, {"redis", rb}} {
		ctx := context.Background()
		b.Run("backend="+be.name, func(b *testing.B) {
			for b.Loop() {
				cycle(b, ctx, be.g, b.Name())
			}
		})
		b.Run("backend="+be.name+"/parallel", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					cycle(b, ctx, be.g, b.Name())
				}
			})
		})
	}
}
