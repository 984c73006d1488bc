package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	polygate "github.com/polygate/polygate/clientsdk/go"
	"github.com/polygate/polygate/e2e/upstream"
)

// waitScopes: "open" has a breaker that stays open for a minute once a dead
// key opened it; "slot" has one concurrency slot and polls slowly, so that a
// waiter is only admitted early when the sidecar wakes it; "limited" answers
// with a long Retry-After.
func waitScopes(baseURL string) string {
	return `
scopes:
  open:
    circuit_open: wait
    source_dead: wait # the dead key only opens the breaker: the deadline decides
    max_attempts: 1
    breaker: {cooldown: 60s, max_cooldown: 60s}
    sources:
      - {name: primary, timeout: 5s, attributes: {base_url: "` + baseURL + `/open"}}
  slot:
    quota_full: wait
    backpressure: {stall_window: 60s, poll_interval: 10s}
    sources:
      - {name: primary, max_concurrency: 1, timeout: 60s, attributes: {base_url: "` + baseURL + `/slot"}}
  limited:
    max_attempts: 3
    sources:
      - {name: primary, timeout: 5s, attributes: {base_url: "` + baseURL + `/limited"}}
`
}

// A client deadline is never overslept: when the earliest certain retry is
// past it the call fails at once, and a wait with no certain end is cut at
// the deadline.
func TestDeadline_NeverOverslept(t *testing.T) {
	up := newUpstream(t)
	sc := startSidecar(t, waitScopes(up.URL))
	client := sc.client(t)
	ctx := ctxT(t)

	t.Run("certain retry after the deadline fails at once", func(t *testing.T) {
		up.Set("open", upstream.Step{Status: 401})
		if _, err := polygate.Do(ctx, client, "open", (&attempt{}).fn); !errors.Is(err, polygate.ErrRetryExhausted) {
			t.Fatalf("the dead key's call = %v; want retry_exhausted", err)
		}
		const deadline = 10 * time.Second
		dctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		start := time.Now()
		_, err := polygate.Do(dctx, client, "open", (&attempt{}).fn)
		elapsed := time.Since(start)
		var f *polygate.FailureError
		if !errors.As(err, &f) || f.Reason != polygate.DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call = %v; want deadline_exceeded", err)
		}
		// docs/design.md, OnNoRunnable: "the earliest certain moment is past the deadline: fail
		// now, not then" — far below the deadline (a tenth of it).
		if elapsed > deadline/10 {
			t.Errorf("failed after %v; want at once, far below the %v deadline", elapsed, deadline)
		}
		if f.RetryAfter < 59*time.Second {
			t.Errorf("retry_after %v; want the remaining cooldown (~60s)", f.RetryAfter)
		}
	})

	t.Run("Retry-After past the deadline fails at once", func(t *testing.T) {
		up.Set("limited", upstream.Step{Status: 429, Headers: map[string]string{"Retry-After": "30"}})
		const deadline = 10 * time.Second
		start := time.Now()
		_, err := polygate.Do(ctx, client, "limited", (&attempt{}).fn, polygate.WithTimeout(deadline))
		elapsed := time.Since(start)
		var f *polygate.FailureError
		if !errors.As(err, &f) || f.Reason != polygate.DeadlineExceeded {
			t.Fatalf("call = %v; want deadline_exceeded", err)
		}
		if elapsed > deadline/10 || f.RetryAfter < 30*time.Second {
			t.Errorf("failed after %v with retry_after %v; want at once, with the upstream's 30s", elapsed, f.RetryAfter)
		}
		if n := up.Count("limited"); n != 1 {
			t.Errorf("the upstream received %d requests; want 1", n)
		}
	})

	t.Run("a wait without a certain end is cut at the deadline", func(t *testing.T) {
		up.Set("slot", upstream.Step{Hang: true})
		hctx, release := context.WithCancel(ctx)
		held := make(chan error, 1)
		go func() { _, err := polygate.Do(hctx, client, "slot", (&attempt{}).fn); held <- err }()
		if err := up.WaitCount(ctx, "slot", 1); err != nil {
			t.Fatal(err)
		}
		defer func() { release(); <-held }()

		// With the deadline as an option only, nothing but the sidecar's
		// capping of its sleeps ends the wait.
		const deadline = 4 * time.Second
		start := time.Now()
		_, err := polygate.Do(ctx, client, "slot", (&attempt{}).fn, polygate.WithTimeout(deadline))
		elapsed := time.Since(start)
		var f *polygate.FailureError
		if !errors.As(err, &f) || f.Reason != polygate.DeadlineExceeded {
			t.Fatalf("call = %v; want deadline_exceeded", err)
		}
		// It waits for the slot until the deadline (there is no certain
		// time to fail earlier for), and not longer: the poll interval is
		// 10s, so an uncapped sleep would show. The allowance over the
		// deadline is a quarter of it, for the RPC round trips.
		if elapsed < deadline || elapsed > deadline+deadline/4 {
			t.Errorf("failed after %v; want at the %v deadline", elapsed, deadline)
		}
	})
}

// A cancelled call releases its permit: a caller waiting for the only slot
// is admitted at once, not when the permit's lease (65s) or the next poll
// (5-10s) would have let it in.
func TestCancel_ReleasesPermit(t *testing.T) {
	up := newUpstream(t)
	sc := startSidecar(t, waitScopes(up.URL))
	client := sc.client(t)
	ctx := ctxT(t)
	up.Set("slot", upstream.Step{Hang: true, Times: 1}, upstream.Step{Status: 200})

	actx, cancelA := context.WithCancel(ctx)
	aDone := make(chan error, 1)
	go func() { _, err := polygate.Do(actx, client, "slot", (&attempt{}).fn); aDone <- err }()
	if err := up.WaitCount(ctx, "slot", 1); err != nil { // A's request hangs upstream
		t.Fatal(err)
	}
	b := &attempt{}
	bDone := make(chan error, 1)
	go func() { _, err := polygate.Do(ctx, client, "slot", b.fn); bDone <- err }()
	eventually(t, "B's call open and waiting", func() bool { return sc.liveCalls(t, "slot") == 2 })

	cancelled := time.Now()
	cancelA()
	if err := <-aDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled call = %v; want context.Canceled", err)
	}
	if err := <-bDone; err != nil {
		t.Fatalf("the waiting call = %v; want success once A released the slot", err)
	}
	_, starts, _ := b.log()
	if len(starts) != 1 {
		t.Fatalf("the waiting call made %d attempts; want 1", len(starts))
	}
	// Without A's CANCELLED report the slot would stay taken for the lease
	// (65s); without the sidecar's wake-up B would sleep its poll (at least
	// 5s). Half the poll interval separates "at once" from both.
	if wait := starts[0].Sub(cancelled); wait > 5*time.Second {
		t.Errorf("B was admitted %v after A was cancelled; want at once", wait)
	} else {
		t.Logf("B admitted %v after A was cancelled", wait)
	}
	if n := sc.source(t, "slot", "primary").GetInFlight(); n != 0 {
		t.Errorf("in_flight = %d after both calls ended; want 0", n)
	}
}
