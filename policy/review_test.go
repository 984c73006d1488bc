package policy_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/policy"
)

// A Pick whose caller is gone when the permit comes back gives the permit
// back at once: here the probe, which would otherwise block the breaker for
// the whole probe_ttl.
func TestPickOfAGoneCallerGivesThePermitBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
breaker: {fail_threshold: 1, cooldown: 5s, probe_ttl: 600s}
sources: [{name: only}]
`)
		fail(t, s, policy.Transient)
		time.Sleep(5 * time.Second)
		gone, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.Pick(gone, newCall(s)); err == nil {
			t.Fatal("Pick for a gone caller succeeded")
		}
		g := grant(t, s, newCall(s))
		if !g.Permit.Probe {
			t.Fatalf("the next caller got %+v, want the probe the gone caller gave back", g.Permit)
		}
	})
}

// Past its stall budget, a call whose scope keeps making progress is not
// stalled; its backoff is then the full one, never 0.
func TestBackoffPastTheStallBudgetIsNotZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
backoff: {base: 1s, max: 1s}
backpressure: {stall_window: 10s, poll_interval: 100ms}
sources: [{name: only, max_concurrency: 10}]
`)
		c := newCall(s)
		for range 15 {
			// Someone else succeeds meanwhile: the scope makes progress.
			other := newCall(s)
			record(t, s, other, grant(t, s, other), policy.Success)
			g := grant(t, s, c)
			time.Sleep(time.Second) // the 429 attempt takes a second (refunded)
			r := record(t, s, c, g, policy.RateLimited)
			if r.Next.Retry == nil {
				t.Fatalf("429 while the scope progresses: %v, want a retry", r.Next)
			}
			waited := c.Stats(time.Now()).Waiting
			switch {
			case *r.Next.Retry <= 0:
				t.Fatalf("backoff %v after %v of waiting, want never 0", *r.Next.Retry, waited)
			case waited >= 10*time.Second+100*time.Millisecond && *r.Next.Retry < 500*time.Millisecond:
				t.Fatalf("backoff %v after %v of waiting: past the stall budget the full (jittered) backoff applies", *r.Next.Retry, waited)
			}
			time.Sleep(*r.Next.Retry)
		}
	})
}

// OnNoRunnable's own read decides before any fail_fast exit: a breaker reset
// elsewhere (its announcement lost) leaves this sidecar's memo stale, yet the
// call is woken, not failed circuit_open.
func TestOnNoRunnableSeesAResetMadeElsewhere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b := newScope(t, `
circuit_open: fail_fast
breaker: {fail_threshold: 1, cooldown: 1h, max_cooldown: 1h}
sources: [{name: only}]
`)
		fail(t, s, policy.Transient)
		c := newCall(s)
		if nr := pick(t, s, c).NoRunnable; nr == nil || nr.Sources[0].Reason != gate.ReasonCooldown {
			t.Fatalf("want a refusal by the memo, got %+v", nr)
		}
		// Another replica resets the breaker; this sidecar hears nothing.
		src := s.Config().Gate(0)
		if _, err := b.Override(ctx(t), gate.OverrideRequest{Scope: "s", Source: &src, Action: gate.ActionReset, Actor: "elsewhere", Why: "test"}); err != nil {
			t.Fatal(err)
		}
		d, err := s.OnNoRunnable(ctx(t), c)
		if err != nil || d.Failure != nil || !d.Woken {
			t.Fatalf("decision %+v %v, want a wake-up", d, err)
		}
		if pick(t, s, c).Grant == nil {
			t.Fatal("the source reset elsewhere is still skipped")
		}
	})
}

// A reload while outcomes are recorded races on nothing and loses no failure
// mark (run with -race).
func TestReloadDuringOutcomes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newScope(t, `
breaker: {fail_threshold: 1000, min_calls: 1000, window: 1h}
sources: [{name: a, max_concurrency: 100}, {name: b, max_concurrency: 100}]
`)
		cfg := s.Config()
		var wg sync.WaitGroup
		wg.Go(func() {
			for range 50 {
				s.Update(cfg)
			}
		})
		wg.Go(func() {
			for range 50 {
				fail(t, s, policy.Transient)
			}
		})
		wg.Wait()
		d, err := s.Describe(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		marked := 0
		for _, src := range d.Sources {
			if src.FailedRecently {
				marked++
			}
		}
		if marked == 0 {
			t.Fatal("failure marks were lost across reloads")
		}
	})
}
