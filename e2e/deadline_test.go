package e2e

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	polygate "github.com/polygate/polygate/clientsdk/go"
	"github.com/polygate/polygate/e2e/upstream"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
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
// the deadline. "At once" and "cut" are read from the sidecar's answers: the
// first answer after the refusal is the failure (no wait answered first),
// and the time the sidecar says it held the caller never exceeds the
// deadline.
func TestDeadline_NeverOverslept(t *testing.T) {
	up := newUpstream(t)
	sc := startSidecar(t, waitScopes(up.URL))
	client, log := sc.loggedClient(t)
	ctx := ctxT(t)

	t.Run("certain retry after the deadline fails at once", func(t *testing.T) {
		up.Set("open", upstream.Step{Status: 401})
		if _, err := polygate.Do(ctx, client, "open", (&attempt{}).fn); !errors.Is(err, polygate.ErrRetryExhausted) {
			t.Fatalf("the dead key's call = %v; want retry_exhausted", err)
		}
		log.take()
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
		// docs/design.md, OnNoRunnable: "the earliest certain moment is past
		// the deadline: fail now, not then": the refused Pick's OnNoRunnable
		// answers the failure, without a wait.
		rpcs, replies := log.take()
		d, _ := lastReply[*admissionv1.OnNoRunnableResponse](rpcs, replies, "OnNoRunnable")
		if !slices.Equal(rpcs, []string{"Pick", "OnNoRunnable"}) || d.GetFailure().GetReason() != admissionv1.FailureReason_FAILURE_REASON_DEADLINE_EXCEEDED {
			t.Errorf("the call sent %v, OnNoRunnable answered %v; want Pick, then OnNoRunnable failing deadline_exceeded at once", rpcs, d)
		}
		if f.RetryAfter < 59*time.Second || f.Attempts != 0 {
			t.Errorf("retry_after %v after %d attempts; want the remaining cooldown (~60s), none", f.RetryAfter, f.Attempts)
		}
		t.Logf("failed deadline_exceeded after %v (deadline %v), retry_after %v", elapsed, deadline, f.RetryAfter)
	})

	t.Run("Retry-After past the deadline fails at once", func(t *testing.T) {
		up.Set("limited", upstream.Step{Status: 429, Headers: map[string]string{"Retry-After": "30"}})
		log.take()
		const deadline = 10 * time.Second
		start := time.Now()
		_, err := polygate.Do(ctx, client, "limited", (&attempt{}).fn, polygate.WithTimeout(deadline))
		elapsed := time.Since(start)
		var f *polygate.FailureError
		if !errors.As(err, &f) || f.Reason != polygate.DeadlineExceeded {
			t.Fatalf("call = %v; want deadline_exceeded", err)
		}
		// RecordOutcome's answer to the 429 is the failure, not a Retry to
		// sleep into the deadline.
		rpcs, replies := log.take()
		r, _ := lastReply[*admissionv1.RecordOutcomeResponse](rpcs, replies, "RecordOutcome")
		if !slices.Equal(rpcs, []string{"Pick", "RecordOutcome"}) || r.GetFailure().GetReason() != admissionv1.FailureReason_FAILURE_REASON_DEADLINE_EXCEEDED {
			t.Errorf("the call sent %v, RecordOutcome answered %v; want Pick, then RecordOutcome failing deadline_exceeded", rpcs, r)
		}
		if f.RetryAfter < 30*time.Second {
			t.Errorf("retry_after %v; want the upstream's 30s", f.RetryAfter)
		}
		if n := up.Count("limited"); n != 1 {
			t.Errorf("the upstream received %d requests; want 1", n)
		}
		t.Logf("failed deadline_exceeded after %v (deadline %v), retry_after %v", elapsed, deadline, f.RetryAfter)
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
		log.take()

		// With the deadline as an option only, nothing but the sidecar's
		// capping of its sleeps ends the wait.
		const deadline = 4 * time.Second
		start := time.Now()
		_, err := polygate.Do(ctx, client, "slot", (&attempt{}).fn, polygate.WithTimeout(deadline))
		elapsed := time.Since(start)
		var f *polygate.FailureError
		if !errors.As(err, &f) || f.Reason != polygate.DeadlineExceeded || f.Attempts != 0 {
			t.Fatalf("call = %v; want deadline_exceeded without an attempt", err)
		}
		// It waits for the slot: the sidecar held it (there is no certain
		// time to fail earlier for), was not woken (the slot stayed taken),
		// and let it go at the deadline, which ended the call. Uncapped, the
		// hold would last the stall budget (60s; the poller finds nothing
		// admissible at its 10s reads): any hold under the poll interval was
		// cut by the deadline, whatever the machine's load adds to it.
		const pollInterval = 10 * time.Second
		var slept time.Duration
		waits, woken := 0, false
		rpcs, replies := log.take()
		for i, name := range rpcs {
			if w := replyOf[*admissionv1.OnNoRunnableResponse](replies[i]).GetWait(); name == "OnNoRunnable" && w != nil {
				waits++
				slept += w.GetSlept().AsDuration()
				woken = woken || w.GetWoken()
			}
		}
		if waits == 0 || woken || slept <= 0 || slept >= pollInterval {
			t.Errorf("the sidecar held the caller %v over %d waits (woken %v; RPCs %v); want a hold cut at the %v deadline, not woken", slept, waits, woken, rpcs, deadline)
		}
		t.Logf("failed deadline_exceeded after %v (deadline %v); the sidecar held it %v over %d waits", elapsed, deadline, slept, waits)
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
	// Without A's CancelCall the slot would stay taken for the lease
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
