package redisgate_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/redisgate"
	"github.com/polygate/polygate/internal/redistest"
)

// TestAtomicAcrossInstances (M4): many goroutines on two Backends, each with
// its own client (as two replicas would be), against one redis-server.
func TestAtomicAcrossInstances(t *testing.T) {
	ctx := testCtx(t)
	srv := redistest.Start(t)
	clock := gatetest.NewClock()
	backends := []gate.Backend{
		newBackend(t, srv.Client(t), redisgate.Options{Clock: clock.Now}),
		newBackend(t, srv.Client(t), redisgate.Options{Clock: clock.Now}),
	}
	const perBackend = 24

	// race runs f(backend, i) on perBackend goroutines per backend, all
	// released at once.
	race := func(f func(b gate.Backend, i int)) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for bi, b := range backends {
			for i := range perBackend {
				wg.Go(func() {
					<-start
					f(b, bi*perBackend+i)
				})
			}
		}
		close(start)
		wg.Wait()
	}

	t.Run("ExactlyOneProbe", func(t *testing.T) {
		const scope = "atomic-probe"
		src := gatetest.Src("s")
		openBreaker(t, ctx, backends[0], scope, src)
		clock.Advance(src.Breaker.Cooldown) // the first HALF_OPEN moment
		var mu sync.Mutex
		var probes, refusals, halfOpens, leases int
		race(func(b gate.Backend, i int) {
			a, err := b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: fmt.Sprint("p", i), Candidates: []gate.Candidate{{Source: src, Ceiling: 100}}})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if a.Granted && a.Permit.Probe {
				probes++
			}
			for _, r := range a.Rejections {
				if r.Reason == gate.ReasonProbeInFlight && r.RetryAfter == 0 {
					refusals++
				}
			}
			for _, e := range a.Events {
				switch {
				case e.Kind == gate.EventTransition && e.From == gate.Open && e.To == gate.HalfOpen:
					halfOpens++
				case e.Kind == gate.EventProbeLeased:
					leases++
				}
			}
		})
		if probes != 1 || refusals != 2*perBackend-1 || halfOpens != 1 || leases != 1 {
			t.Fatalf("probes %d, probe_in_flight refusals %d, open→half_open %d, probe_leased %d; want 1, %d, 1, 1",
				probes, refusals, halfOpens, leases, 2*perBackend-1)
		}
		if v := peek(t, ctx, backends[1], scope, src).Breaker; v.Epoch != 1 || !v.ProbeOut {
			t.Fatalf("after the race: %+v, want epoch 1 with the probe out", v)
		}
	})

	t.Run("ExactlyOneOpeningPerTrip", func(t *testing.T) {
		const scope = "atomic-trip"
		src := gatetest.Src("s", func(s *gate.Source) { s.Breaker.FailThreshold = 5; s.Breaker.MinCalls = 1000 })
		permits := make([]gate.Permit, 2*perBackend)
		for i := range permits {
			permits[i] = admit(t, ctx, backends[0], scope, fmt.Sprint("p", i), src).Permit
		}
		var opened, applied atomic.Int32
		race(func(b gate.Backend, i int) {
			s, err := b.Settle(ctx, gate.SettleRequest{Scope: scope, Source: src, PermitID: permits[i].ID, Epoch: permits[i].Epoch, Verdict: gate.VerdictFailure, ActualTokens: -1})
			if err != nil {
				t.Error(err)
				return
			}
			if s.Effect == gate.EffectApplied {
				applied.Add(1)
			}
			for _, e := range s.Events {
				if e.Kind == gate.EventTransition && e.To == gate.Open {
					opened.Add(1)
				}
			}
		})
		if opened.Load() != 1 || applied.Load() != 5 {
			t.Fatalf("closed→open events %d, applied failures %d; want 1 and 5 (the rest arrive OPEN: stale)", opened.Load(), applied.Load())
		}
	})

	t.Run("ConcurrencyLimitHolds", func(t *testing.T) {
		const scope = "atomic-slots"
		src := gatetest.Src("s", func(s *gate.Source) { s.Limits.MaxConcurrency = 2 })
		var inFlight, most, grants atomic.Int32
		race(func(b gate.Backend, i int) {
			for k := range 20 {
				a, err := b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: fmt.Sprint("p", i, "-", k), Candidates: []gate.Candidate{{Source: src, Ceiling: 2}}})
				if err != nil {
					t.Error(err)
					return
				}
				if !a.Granted {
					continue
				}
				grants.Add(1)
				// Counted after Redis granted and before Redis releases:
				// this can only be below Redis's own count.
				n := inFlight.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				inFlight.Add(-1)
				s, err := b.Settle(ctx, gate.SettleRequest{Scope: scope, Source: src, PermitID: a.Permit.ID, Epoch: a.Permit.Epoch, Verdict: gate.VerdictSuccess, ActualTokens: -1})
				if err != nil || !s.Released {
					t.Errorf("settle: %+v %v, want released", s, err)
				}
			}
		})
		if most.Load() > 2 || grants.Load() == 0 {
			t.Fatalf("at most %d in flight over %d grants; want <= 2", most.Load(), grants.Load())
		}
		if q := peek(t, ctx, backends[1], scope, src).Quota; q.InFlight != 0 {
			t.Fatalf("in flight after all settled: %d", q.InFlight)
		}
	})

	t.Run("NoLostUpdates", func(t *testing.T) {
		const scope = "atomic-count"
		src := gatetest.Src("s", func(s *gate.Source) { s.Limits.RPM = 1000; s.Limits.TPM = 1_000_000; s.Breaker.Window = time.Hour })
		permits := make([]gate.Permit, 2*perBackend)
		race(func(b gate.Backend, i int) {
			a, err := b.Admit(ctx, gate.AdmitRequest{Scope: scope, PermitID: fmt.Sprint("p", i), Tokens: 10, Candidates: []gate.Candidate{{Source: src, Ceiling: 100}}})
			if err != nil || !a.Granted {
				t.Errorf("admit: %+v %v", a, err)
				return
			}
			permits[i] = a.Permit
		})
		race(func(b gate.Backend, i int) {
			if _, err := b.Settle(ctx, gate.SettleRequest{Scope: scope, Source: src, PermitID: permits[i].ID, Epoch: permits[i].Epoch, Verdict: gate.VerdictSuccess, ActualTokens: 3}); err != nil {
				t.Error(err)
			}
		})
		v := peek(t, ctx, backends[0], scope, src)
		n := int64(2 * perBackend)
		if v.Breaker.Calls != n || v.Quota.Requests != n || v.Quota.Tokens != 3*n || v.Quota.InFlight != 0 {
			t.Fatalf("after %d attempts: %+v, want %d calls, %d requests, %d tokens, none in flight", n, v, n, n, 3*n)
		}
	})
}
