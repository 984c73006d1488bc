package policy_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
	"github.com/polygate/polygate/policy"
)

// waitings counts the calls that started waiting.
type waitings struct {
	policy.NopObserver
	n atomic.Int64
}

func (w *waitings) Waiting(*policy.Call, time.Duration, []gate.Rejection) { w.n.Add(1) }

// BenchmarkHeldCall measures what policy spends on a call held in
// OnNoRunnable, as make bench's held mode holds them (one source forced
// open, circuit_open: wait), without gRPC, on the memory backend and on a
// redis-server of its own: per op, the call, its Pick refused and its
// OnNoRunnable up to its hold (allocs/op and B/op: the garbage and the live
// objects a held call makes), and, with every op's call held at once, the
// live heap per held call after a GC (live-B/held, its goroutine's
// descriptor aside):
//
//	go test -run '^$' -bench HeldCall -benchmem -benchtime 10000x ./policy/
//
// A held call's garbage matters as much as what it keeps: it is what the
// heap grows by between GC cycles while the calls come in, and it stays
// resident (docs/performance.md, "What a held call costs"). The calls come
// one at a time: on Redis each Pick is an admit of its own, not one of a
// batch as under make bench's 64 pickers.
func BenchmarkHeldCall(b *testing.B) {
	b.Run("backend=memory", func(b *testing.B) { benchHeldCall(b, inmem.New(nil)) })
	b.Run("backend=redis", func(b *testing.B) {
		rb, err := redisgate.New(redistest.Start(b).Client(b), redisgate.Options{Timeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		benchHeldCall(b, rb)
	})
}

func benchHeldCall(b *testing.B, backend gate.Backend) {
	cfg, err := config.Parse([]byte(`
scopes:
  held:
    circuit_open: wait
    backpressure: {stall_window: 600s, poll_interval: 50ms}
    sources:
      - {name: only, max_concurrency: 1000, timeout: 60s}
`), nil)
	if err != nil {
		b.Fatal(err)
	}
	seen := &waitings{}
	s := policy.NewScope(cfg.Scopes["held"], backend, policy.Options{Observer: seen})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := s.Override(ctx, "only", gate.ActionForceOpen, "bench", "held calls"); err != nil {
		b.Fatal(err)
	}
	spareGoroutines(b.N)
	live := func() uint64 {
		runtime.GC()
		m := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(m)
		return m[0].Value.Uint64()
	}
	before := live()
	var (
		held sync.WaitGroup
		bad  atomic.Value
	)
	b.ResetTimer()
	for i := range b.N {
		c := policy.NewCall(policy.NewID("c"), "held", 0, time.Time{}, time.Now())
		p, err := s.Pick(ctx, c)
		if err != nil || p.NoRunnable == nil {
			b.Fatalf("Pick: %v %+v, want a refusal", err, p)
		}
		held.Add(1)
		go func() {
			defer held.Done()
			if d, err := s.OnNoRunnable(ctx, c); err != nil || !d.Woken {
				bad.Store(fmt.Errorf("%+v, %v", d, err))
			}
		}()
		for seen.n.Load() <= int64(i) {
			runtime.Gosched() // one call at a time: its garbage, not a crowd's
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(live()-before)/float64(b.N), "live-B/held")
	if _, err := s.Override(ctx, "only", gate.ActionClear, "bench", "held calls"); err != nil {
		b.Fatal(err)
	}
	held.Wait()
	if err := bad.Load(); err != nil {
		b.Fatalf("a held call was not woken by the clear: %v", err)
	}
}

// spareGoroutines starts and ends n goroutines, so that the runtime has n
// goroutine descriptors (g, ~470 B each) to reuse: the held calls'
// goroutines are then not counted in live-B/held, in whichever cell runs
// first (the RPC's goroutine is grpc-go's, not policy's).
func spareGoroutines(n int) {
	var started, ended sync.WaitGroup
	release := make(chan struct{})
	started.Add(n)
	ended.Add(n)
	for range n {
		go func() {
			defer ended.Done()
			started.Done()
			<-release
		}()
	}
	started.Wait()
	close(release)
	ended.Wait()
}
