package redisgate_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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

// BenchmarkAttemptCycle measures one attempt at the backend seam as the
// sidecar makes it (an Admit on one source as a waiter of an empty line,
// then a Settle as a success handing the slot on), on the memory backend
// and on a loopback redis-server in production mode (TIME), with 1, 16
// and 64 callers (run with -cpu 1 for those counts):
//
//	go test -run '^$' -bench AttemptCycle -cpu 1 -benchmem ./gate/redisgate/
//
// On Redis it also reports redis-server's CPU per attempt (INFO cpu) and
// the calls per attempt (ops of a scope that meet share a call).
func BenchmarkAttemptCycle(b *testing.B) {
	client := redistest.Start(b).Client(b)
	rb, err := redisgate.New(client, redisgate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1_000_000 })
	var ids atomic.Int64
	cycle := func(b *testing.B, g gate.Backend, scope string) {
		ctx := context.Background()
		id := fmt.Sprint("p", ids.Add(1))
		w := &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 64, Lease: time.Second}
		a, err := g.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: id, Tokens: 10,
			Candidates: []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}}, Line: w})
		if err != nil || !a.Granted {
			b.Fatalf("Admit: %+v %v", a, err)
		}
		if _, err := g.Settle(ctx, gate.SettleRequest{Scope: scope, Source: src, PermitID: a.Permit.ID, Epoch: a.Permit.Epoch,
			Verdict: gate.VerdictSuccess, ActualTokens: 12, Progress: true, Line: &gate.LineHandoff{Lease: time.Second}}); err != nil {
			b.Fatal(err)
		}
	}
	for _, be := range []struct {
		name string
		g    gate.Backend
	}{{"memory", inmem.New(nil)}, {"redis", rb}} {
		for _, par := range []int{1, 16, 64} {
			b.Run("backend="+be.name+"/parallel="+strconv.Itoa(par), func(b *testing.B) {
				scope := strings.ReplaceAll(b.Name(), "/", "-")
				cycle(b, be.g, scope) // a first admit of a scope learns its marker
				cpu, calls := redisCPU(b, client), rb.BatchStats().Calls
				b.ResetTimer()
				b.SetParallelism(par)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						cycle(b, be.g, scope)
					}
				})
				b.StopTimer()
				if be.name == "redis" {
					b.ReportMetric(float64((redisCPU(b, client)-cpu).Microseconds())/float64(b.N), "redis-cpu-µs/op")
					b.ReportMetric(float64(rb.BatchStats().Calls-calls)/float64(b.N), "calls/op")
				}
			})
		}
	}
}

// redisCPU is redis-server's CPU time so far (INFO cpu: system and user).
func redisCPU(b *testing.B, c *redis.Client) time.Duration {
	info := must(c.Info(context.Background(), "cpu").Result())(b)
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}
