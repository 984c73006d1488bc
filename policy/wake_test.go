package policy_test

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/policy"
)

// A waiting caller is woken as soon as what it waits for changes, and never
// later than the computed sleep.
func TestWaitersWakeOnChange(t *testing.T) {
	t.Run("PermitReleased", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
backpressure: {poll_interval: 10s, stall_window: 300s}
sources: [{name: only, max_concurrency: 1}]
`)
			holder := newCall(s)
			g := grant(t, s, holder)
			waiter := newCall(s)
			pick(t, s, waiter)
			var wg sync.WaitGroup
			var d policy.Decision
			wg.Go(func() {
				var err error
				if d, err = s.OnNoRunnable(ctx(t), waiter); err != nil {
					t.Error(err)
				}
			})
			time.Sleep(time.Second)
			record(t, s, holder, g, policy.Success)
			wg.Wait()
			if !d.Woken || d.Slept != time.Second || d.Sleep != 0 {
				t.Fatalf("decision %+v, want woken after 1s", d)
			}
			if pick(t, s, waiter).Grant == nil {
				t.Fatal("the woken caller was refused")
			}
		})
	})

	// A permit released between the refused Pick and OnNoRunnable (before the
	// wake-ups were taken) is seen by OnNoRunnable's read: a wake-up, at once.
	t.Run("ReleasedBeforeTheWait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
backpressure: {poll_interval: 10s, stall_window: 300s}
sources: [{name: only, max_concurrency: 1}]
`)
			holder := newCall(s)
			g := grant(t, s, holder)
			waiter := newCall(s)
			pick(t, s, waiter)
			record(t, s, holder, g, policy.Success)
			d, err := s.OnNoRunnable(ctx(t), waiter)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Woken || d.Slept != 0 || d.Sleep != 0 {
				t.Fatalf("decision %+v, want an immediate wake-up, not a hold", d)
			}
		})
	})

	t.Run("ProbeSucceeded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
circuit_open: wait
backpressure: {poll_interval: 10s, stall_window: 300s}
breaker: {fail_threshold: 1, cooldown: 5s}
sources: [{name: only}]
`)
			fail(t, s, policy.Transient)
			time.Sleep(5 * time.Second)
			prober := newCall(s)
			probe := grant(t, s, prober)
			waiter := newCall(s)
			pick(t, s, waiter) // probe_in_flight: no certain time, the caller is held
			var wg sync.WaitGroup
			var d policy.Decision
			wg.Go(func() { d, _ = s.OnNoRunnable(ctx(t), waiter) })
			time.Sleep(2 * time.Second)
			record(t, s, prober, probe, policy.Success)
			wg.Wait()
			if !d.Woken || d.Slept != 2*time.Second {
				t.Fatalf("decision %+v, want woken when the probe closed the breaker", d)
			}
		})
	})

	t.Run("ReleaseDoesNotWakeABreakerWait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
circuit_open: wait
backpressure: {poll_interval: 100ms, stall_window: 300s}
breaker: {fail_threshold: 1, cooldown: 60s}
sources: [{name: only, max_concurrency: 5}]
`)
			held := newCall(s)
			g := grant(t, s, held) // admitted before the breaker opens
			fail(t, s, policy.Transient)
			waiter := newCall(s)
			pick(t, s, waiter)
			var wg sync.WaitGroup
			var d policy.Decision
			wg.Go(func() { d, _ = s.OnNoRunnable(ctx(t), waiter) })
			time.Sleep(time.Second)
			record(t, s, held, g, policy.Success) // stale for the breaker, frees a slot
			wg.Wait()
			if d.Woken || d.Slept != 60*time.Second+75*time.Millisecond {
				t.Fatalf("decision %+v, want the whole cooldown slept", d)
			}
		})
	})

	// What no local signal reports — here a lease that expires, as a slot
	// freed on another replica would be — the scope's poller notices within
	// one poll interval.
	t.Run("PollerNoticesAnExpiredLease", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
backpressure: {poll_interval: 100ms, stall_window: 300s}
lease_grace: 0s
sources: [{name: only, max_concurrency: 1, timeout: 10s}]
`)
			grant(t, s, newCall(s)) // never settled: its lease ends at 10s
			waiter := newCall(s)
			pick(t, s, waiter)
			d, err := s.OnNoRunnable(ctx(t), waiter)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Woken || d.Slept < 10*time.Second || d.Slept > 10*time.Second+100*time.Millisecond {
				t.Fatalf("decision %+v, want woken within one poll interval of the lease's end at 10s", d)
			}
			if pick(t, s, waiter).Grant == nil {
				t.Fatal("the woken caller was refused")
			}
		})
	})

	t.Run("PollerNoticesAnExpiredProbeLease", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
circuit_open: wait
backpressure: {poll_interval: 100ms, stall_window: 300s}
breaker: {fail_threshold: 1, cooldown: 5s, probe_ttl: 30s}
sources: [{name: only}]
`)
			fail(t, s, policy.Transient)
			time.Sleep(5 * time.Second)
			grant(t, s, newCall(s)) // the probe, never reported
			waiter := newCall(s)
			pick(t, s, waiter)
			d, _ := s.OnNoRunnable(ctx(t), waiter)
			// Every held caller is refused by the breaker: the poller backs
			// off while its reads find nothing, up to one second.
			if !d.Woken || d.Slept < 30*time.Second || d.Slept > 31*time.Second {
				t.Fatalf("decision %+v, want woken within a second of the probe lease's end", d)
			}
			if g := pick(t, s, waiter).Grant; g == nil || !g.Permit.Probe {
				t.Fatalf("after the lease ran out the waiter should take the new probe, got %+v", g)
			}
		})
	})

	t.Run("CallerDeadlineLeavesTheRest", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newScope(t, `
circuit_open: wait
breaker: {fail_threshold: 1, cooldown: 60s}
sources: [{name: only}]
`)
			fail(t, s, policy.Transient)
			c := newCall(s)
			pick(t, s, c)
			rpc, cancel := contextWithTimeout(t, 10*time.Second)
			defer cancel()
			d, err := s.OnNoRunnable(rpc, c)
			if err != nil {
				t.Fatal(err)
			}
			// The RPC deadline cuts the server-side sleep (answering 50ms
			// early); the caller sleeps the rest itself.
			if d.Slept != 10*time.Second-50*time.Millisecond || d.Sleep != 60*time.Second+38*time.Millisecond-d.Slept {
				t.Fatalf("decision %+v", d)
			}
		})
	})
}
