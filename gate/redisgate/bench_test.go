package redisgate_test

import (
	"context"
	"fmt"
	"os"
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

// BenchmarkAttemptCycle measures one attempt at the backend seam (Admit on
// one source, then Settle as a success) on the memory backend and on a
// loopback redis-server in production mode (TIME), serial and parallel;
// ordered is the attempt as an enforcing scope makes it, with the line
// (the Pick as a waiter, the Settle handing the slot on; nobody waits):
//
//	go test -run '^$' -bench AttemptCycle -benchmem ./gate/redisgate/
//
// Each cell is a leaf (serial, parallel, parallel=16, parallel=64), so
// that a pattern naming one runs that cell alone (-cpu 1 for the parallel
// ones to mean 1, 16 and 64 callers):
//
//	go test -run '^$' -bench 'AttemptCycle/backend=redis/limits=concurrency/parallel=64$' -cpu 1 ./gate/redisgate/
//
// The source has an rpm limit; limits=concurrency is the same attempt on a
// source with a concurrency limit only (make bench's), whose minute's log
// is not kept. ordered/limits=concurrency is the attempt the sidecar makes
// in make bench (an enforcing scope's Pick, a waiter on an empty line, and
// its RecordOutcome, a handoff; a source with a concurrency limit only):
// the cell that measures the path users run. On Redis the serial cells also report the server's CPU per
// attempt (INFO cpu: redis-cpu-µs/op). POLYGATE_BENCH_REDIS=host:port runs
// the benchmark against that server instead of one of its own, for
// instance a redis-server under valgrind --tool=callgrind, whose
// instruction count does not move with the machine's load
// (docs/performance.md).
func BenchmarkAttemptCycle(b *testing.B) {
	var client *redis.Client
	if addr := os.Getenv("POLYGATE_BENCH_REDIS"); addr != "" {
		client = redis.NewClient(&redis.Options{Addr: addr})
		b.Cleanup(func() { _ = client.Close() })
	} else {
		client = redistest.Start(b).Client(b)
	}
	rb, err := redisgate.New(client, redisgate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	rpmSrc := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1_000_000; s.Limits.RPM = 100_000_000 })
	concSrc := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 1_000_000 })
	var ids atomic.Int64
	cycle := func(b *testing.B, ctx context.Context, g gate.Backend, src *gate.Source, scope string, ordered bool) {
		id := fmt.Sprint("p", ids.Add(1))
		var w *gate.Waiter
		var h *gate.LineHandoff
		if ordered {
			w = &gate.Waiter{ID: id, Weight: 1, OtherWeight: 1, MaxTenants: 64, Lease: time.Second}
			h = &gate.LineHandoff{Lease: time.Second}
		}
		a, err := g.Admit(ctx, gate.AdmitRequest{
			Scope: scope, PermitID: id, Tokens: 10,
			Candidates: []gate.Candidate{{Source: src, Ceiling: src.Limits.MaxConcurrency}}, Line: w,
		})
		if err != nil || !a.Granted {
			b.Fatalf("Admit: %+v %v", a, err)
		}
		if _, err := g.Settle(ctx, gate.SettleRequest{
			Scope: scope, Source: src, PermitID: a.Permit.ID, Epoch: a.Permit.Epoch,
			Verdict: gate.VerdictSuccess, ActualTokens: 12, Progress: true, Line: h,
		}); err != nil {
			b.Fatal(err)
		}
	}
	for _, be := range []struct {
		name string
		g    gate.Backend
	}{{"memory", inmem.New(nil)}, {"redis", rb}} {
		ctx := context.Background()
		for _, c := range []struct {
			suffix  string
			src     *gate.Source
			ordered bool
		}{
			{"", rpmSrc, false}, {"/ordered", rpmSrc, true}, {"/limits=concurrency", concSrc, false},
			{"/ordered/limits=concurrency", concSrc, true},
		} {
			name := "backend=" + be.name + c.suffix
			b.Run(name+"/serial", func(b *testing.B) {
				u, n := scriptStats(b, client)
				cpu := redisCPU(b, client)
				for b.Loop() {
					cycle(b, ctx, be.g, c.src, b.Name(), c.ordered)
				}
				u1, n1 := scriptStats(b, client)
				b.ReportMetric(float64(u1-u)/float64(b.N), "redis-µs/op")
				b.ReportMetric(float64(n1-n)/float64(b.N), "redis-cmds/op")
				b.ReportMetric(float64((redisCPU(b, client)-cpu).Microseconds())/float64(b.N), "redis-cpu-µs/op")
			})
			// Parallel: callers per GOMAXPROCS (run with -cpu 1 for 16
			// and 64 callers), as many attempts at once as make bench's
			// levels; on Redis the Admits and Settles of one scope that
			// meet go out in batches (redis-calls/op: script calls per
			// attempt).
			for _, par := range []int{1, 16, 64} {
				sub := name + "/parallel"
				if par > 1 {
					sub += "=" + strconv.Itoa(par)
				}
				b.Run(sub, func(b *testing.B) {
					u, n := scriptStats(b, client)
					calls := scriptCalls(b, client)
					cpu := redisCPU(b, client)
					b.SetParallelism(par)
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							cycle(b, ctx, be.g, c.src, b.Name(), c.ordered)
						}
					})
					if be.name != "redis" {
						return
					}
					u1, n1 := scriptStats(b, client)
					b.ReportMetric(float64(u1-u)/float64(b.N), "redis-µs/op")
					b.ReportMetric(float64(n1-n)/float64(b.N), "redis-cmds/op")
					b.ReportMetric(float64(scriptCalls(b, client)-calls)/float64(b.N), "redis-calls/op")
					b.ReportMetric(float64((redisCPU(b, client)-cpu).Microseconds())/float64(b.N), "redis-cpu-µs/op")
				})
			}
		}
	}
}

// redisCPU is the CPU time the server has used (INFO cpu: used_cpu_user +
// used_cpu_sys): unlike commandstats' µs, it leaves out the time the server
// waited for a core.
func redisCPU(b *testing.B, c redis.UniversalClient) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sec float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu: %s=%q", k, v)
			}
			sec += f
		}
	}
	return time.Duration(sec * float64(time.Second))
}

// scriptCalls is how many script calls (FCALL, EVALSHA, EVAL) the server
// has run.
func scriptCalls(b *testing.B, c redis.UniversalClient) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_fcall" && name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if k, v, _ := strings.Cut(f, "="); k == "calls" {
				c, _ := strconv.ParseInt(v, 10, 64)
				n += c
			}
		}
	}
	return n
}

// scriptStats is the Redis server's work so far in script calls, from INFO
// commandstats: the time in FCALL, EVALSHA and EVAL (µs), and how many
// commands the scripts ran (every other command but INFO): the cost of a
// decision on the one shared resource. The count is exact; the time is
// steadier than a round trip's but still moves with the machine's load.
func scriptStats(b *testing.B, c redis.UniversalClient) (usec, cmds int64) {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		script := name == "cmdstat_fcall" || name == "cmdstat_evalsha" || name == "cmdstat_eval"
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch {
			case script && k == "usec":
				usec += n
			case !script && k == "calls":
				cmds += n
			}
		}
	}
	return usec, cmds
}
