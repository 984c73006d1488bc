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
// open, circuit_open: wait), without gRPC: per op, the call, its Pick
// refused and its OnNoRunnable up to its hold (allocs/op and B/op: the
// garbage and the live objects a held call makes), and, with every op's
// call held at once, the live heap per held call after a GC
// (live-B/held):
//
//	go test -run '^$' -bench HeldCall -benchmem -benchtime 10000x ./policy/
//
// A held call's garbage matters as much as what it keeps: it is what the
// heap grows by between GC cycles while the calls come in, and it stays
// resident (docs/performance.md, "What a held call costs").
func BenchmarkHeldCall(b *testing.B) {
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
	s := policy.NewScope(cfg.Scopes["held"], inmem.New(nil), policy.Options{Observer: seen})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.Override(ctx, "only", gate.ActionForceOpen, "bench", "held calls"); err != nil {
		b.Fatal(err)
	}
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
	n := 0
	for b.Loop() {
		n++
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
		for seen.n.Load() < int64(n) {
			runtime.Gosched() // one call at a time: its garbage, not a crowd's
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(live()-before)/float64(n), "live-B/held")
	if _, err := s.Override(ctx, "only", gate.ActionClear, "bench", "held calls"); err != nil {
		b.Fatal(err)
	}
	held.Wait()
	if err := bad.Load(); err != nil {
		b.Fatalf("a held call was not woken by the clear: %v", err)
	}
}
