package e2e

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	polygate "github.com/polygate/polygate/clientsdk/go"
	"github.com/polygate/polygate/e2e/upstream"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// incidentConfig is the user's incident, time-compressed: one source whose
// breaker opens after three consecutive failures.
func incidentConfig(policy, baseURL string, cooldown, maxCooldown time.Duration) string {
	return fmt.Sprintf(`
scopes:
  incident:
    circuit_open: %s
    max_attempts: %d
    backoff: {base: 10ms, max: 20ms}
    backpressure: {stall_window: 30s, poll_interval: 20ms}
    breaker: {fail_threshold: 3, min_calls: 100, fail_rate: 1.0, window: 60s, cooldown: %s, max_cooldown: %s}
    sources:
      - name: primary
        max_concurrency: 16
        timeout: 5s
        attributes: {base_url: "%s"}
`, policy, map[string]int{"fail_fast": 3, "wait": 30}[policy], cooldown, maxCooldown, baseURL)
}

// With circuit_open: fail_fast, calls made while the breaker is open fail
// within milliseconds with circuit_open and the remaining cooldown, without
// reaching the upstream; after the cooldown the next call probes and the
// source is back.
func TestIncident_FailFast(t *testing.T) {
	const cooldown = 10 * time.Second
	up := newUpstream(t)
	sc := startSidecar(t, incidentConfig("fail_fast", up.URL+"/primary", cooldown, cooldown))
	client, log := sc.loggedClient(t)
	ctx := ctxT(t)

	up.Set("primary", upstream.Step{Status: 503})
	trip := &attempt{}
	_, err := polygate.Do(ctx, client, "incident", trip.fn)
	tripped := time.Now()
	if !errors.Is(err, polygate.ErrRetryExhausted) {
		t.Fatalf("the call during the outage = %v; want retry_exhausted after 3 attempts", err)
	}
	_, _, ends := trip.log()
	if len(ends) != 3 {
		t.Fatalf("the tripping call made %d attempts; want 3", len(ends))
	}
	// The breaker opened while the third failure was reported: after that
	// attempt ended and before Do returned.
	openedAfter, openedBefore := ends[2], tripped
	if st := sc.source(t, "incident", "primary").GetState(); st != admissionv1.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("breaker %v after 3 consecutive failures; want OPEN", st)
	}

	var last *polygate.FailureError
	log.take()
	for i := range 5 {
		start := time.Now()
		_, err := polygate.Do(ctx, client, "incident", trip.fn)
		elapsed := time.Since(start)
		var f *polygate.FailureError
		if !errors.As(err, &f) || f.Reason != polygate.CircuitOpen || !errors.Is(err, polygate.ErrCircuitOpen) {
			t.Fatalf("call %d while open = %v; want circuit_open", i+1, err)
		}
		// "Fails within milliseconds": the refused Pick's OnNoRunnable
		// answers the failure, the sidecar holding nobody.
		rpcs, replies := log.take()
		d, _ := lastReply[*admissionv1.OnNoRunnableResponse](rpcs, replies, "OnNoRunnable")
		if !slices.Equal(rpcs, []string{"Pick", "OnNoRunnable"}) || d.GetFailure().GetReason() != admissionv1.FailureReason_FAILURE_REASON_CIRCUIT_OPEN {
			t.Errorf("call %d while open sent %v, OnNoRunnable answered %v; want Pick, then OnNoRunnable failing circuit_open at once", i+1, rpcs, d)
		}
		// retry_after is the remaining cooldown. The breaker's clock counts
		// whole milliseconds (open_until = the opening millisecond + cooldown;
		// the remaining time is rounded up), hence a millisecond either way.
		low := openedAfter.Add(cooldown).Sub(start.Add(elapsed)) - time.Millisecond
		high := openedBefore.Add(cooldown).Sub(start) + time.Millisecond
		if f.RetryAfter < low || f.RetryAfter > high || f.RetryAfter <= 0 {
			t.Errorf("call %d: retry_after %v; want the remaining cooldown, within [%v, %v]", i+1, f.RetryAfter, low, high)
		}
		if len(f.PerSource) != 1 || f.PerSource[0].Source != "primary" || f.PerSource[0].RetryAfter <= 0 {
			t.Errorf("call %d: per-source reasons %+v; want primary with its cooldown", i+1, f.PerSource)
		}
		if f.Attempts != 0 {
			t.Errorf("call %d made %d attempts while the circuit was open", i+1, f.Attempts)
		}
		last = f
	}
	if n := up.Count("primary"); n != 3 {
		t.Errorf("the upstream received %d requests; want only the 3 before the breaker opened", n)
	}

	// Recovery: waiting exactly the reported retry_after is never early.
	up.Set("primary", upstream.Step{Status: 200})
	time.Sleep(last.RetryAfter)
	probe := &attempt{}
	if _, err := polygate.Do(ctx, client, "incident", probe.fn); err != nil {
		t.Fatalf("the first call after the cooldown = %v; want success on the probe", err)
	}
	if g, _, _ := probe.log(); len(g) != 1 || !g[0].Probe {
		t.Errorf("the first call after the cooldown ran %+v; want one probe", g)
	}
	after := &attempt{}
	if _, err := polygate.Do(ctx, client, "incident", after.fn); err != nil {
		t.Fatal(err)
	}
	if g, _, _ := after.log(); len(g) != 1 || g[0].Probe {
		t.Errorf("the call after recovery ran %+v; want one ordinary attempt", g)
	}
	if st := sc.source(t, "incident", "primary").GetState(); st != admissionv1.BreakerState_BREAKER_STATE_CLOSED {
		t.Errorf("breaker %v after a successful probe; want CLOSED", st)
	}
}

// With circuit_open: wait, every call made during the outage succeeds after
// recovery, and the upstream receives at most one probe per cooldown while
// the breaker is open.
func TestIncident_Wait(t *testing.T) {
	const cooldown, maxCooldown = 300 * time.Millisecond, 600 * time.Millisecond
	up := newUpstream(t)
	sc := startSidecar(t, incidentConfig("wait", up.URL+"/primary", cooldown, maxCooldown))
	client := sc.client(t)
	ctx := ctxT(t)

	up.Set("primary", upstream.Step{Status: 503})
	var wg sync.WaitGroup
	results := make([]error, 0, 6)
	var mu sync.Mutex
	call := func() {
		wg.Go(func() {
			_, err := polygate.Do(ctx, client, "incident", (&attempt{}).fn)
			mu.Lock()
			results = append(results, err)
			mu.Unlock()
		})
	}

	call() // its first three attempts open the breaker; then it waits
	eventually(t, "breaker OPEN", func() bool {
		return sc.source(t, "incident", "primary").GetState() == admissionv1.BreakerState_BREAKER_STATE_OPEN
	})
	tripped := up.Count("primary")
	if tripped != 3 {
		t.Fatalf("the breaker opened after %d requests; want 3 (fail_threshold)", tripped)
	}
	// More calls arrive during the outage: now, after the first failed probe
	// and after the second.
	call()
	call()
	if err := up.WaitCount(ctx, "primary", tripped+1); err != nil {
		t.Fatal(err)
	}
	call()
	call()
	if err := up.WaitCount(ctx, "primary", tripped+2); err != nil {
		t.Fatal(err)
	}
	call()
	up.Set("primary", upstream.Step{Status: 200}) // the provider recovers
	failedProbes := up.Count("primary") - tripped
	wg.Wait()

	for i, err := range results {
		if err != nil {
			t.Errorf("call %d of the outage = %v; want success after recovery", i+1, err)
		}
	}
	if len(results) != 6 {
		t.Fatalf("%d calls returned; want 6", len(results))
	}
	reqs := up.Requests("primary")
	// The open period runs from the failure that tripped the breaker to the
	// probe that succeeded; every request in it but the first is a probe.
	closing := -1
	for i, r := range reqs {
		if r.Status == 200 {
			closing = i
			break
		}
	}
	if closing != tripped+failedProbes {
		t.Fatalf("the first success is request %d; want %d (3 failures, %d failed probes, then the closing probe)", closing+1, tripped+failedProbes+1, failedProbes)
	}
	assertSpacing(t, "probes while open", reqs[tripped-1:closing+1], cooldown)
	// After the closing probe every other call needs exactly one attempt.
	if after := len(reqs) - closing; after != len(results) {
		t.Errorf("%d requests from the closing probe on; want %d, one per call", after, len(results))
	}
	t.Logf("outage: %d failed probes, open for %v, %d calls all served after recovery",
		failedProbes, reqs[closing].At.Sub(reqs[tripped-1].At), len(results))
}
