package e2e

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	polygate "github.com/polygate/polygate/clientsdk/go"
	"github.com/polygate/polygate/e2e/upstream"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// quickstartScope is the README's single-source scope (circuit_open: wait,
// a 60 s cooldown), with source_dead set and cooldown overridable.
func quickstartScope(sourceDead, cooldown, baseURL string) string {
	return fmt.Sprintf(`
scopes:
  chat:
    circuit_open: wait
    source_dead: %s
    quota_full: wait
    max_attempts: 3
    backoff: {base: 1s, max: 60s}
    backpressure: {stall_window: 300s, poll_interval: 50ms}
    breaker: {fail_threshold: 5, min_calls: 10, fail_rate: 0.5, window: 60s, cooldown: %s, max_cooldown: 300s}
    sources:
      - name: primary
        max_concurrency: 8
        timeout: 300s
        attributes: {base_url: "%s"}
`, sourceDead, cooldown, baseURL)
}

// A dead key fails fast and loudly: with the quickstart's single-source scope
// (circuit_open: wait) and an upstream answering 401, the first call ends
// with RecordOutcome's answer to its one attempt (Failure source_dead with
// the remaining cooldown: no backoff, no second Pick), and the next one with
// source_dead before any attempt, without reaching the upstream.
func TestSourceDead_FailsFast(t *testing.T) {
	const cooldown = 60 * time.Second
	up := newUpstream(t)
	sc := startSidecar(t, quickstartScope("fail_fast", cooldown.String(), up.URL+"/primary"))
	client, log := sc.loggedClient(t)
	ctx := ctxT(t)
	up.Set("primary", upstream.Step{Status: 401})

	for i, want := range []int{1, 0} {
		start := time.Now()
		a := &attempt{}
		_, err := polygate.Do(ctx, client, "chat", a.fn)
		elapsed := time.Since(start)
		var f *polygate.FailureError
		if !errors.As(err, &f) || f.Reason != polygate.DeadSource || !errors.Is(err, polygate.ErrSourceDead) || !errors.Is(err, polygate.ErrAllSourcesExhausted) {
			t.Fatalf("call %d with a dead key = %v; want source_dead", i+1, err)
		}
		// retry_after is the remaining cooldown: positive, never more than it.
		if f.RetryAfter <= 0 || f.RetryAfter > cooldown {
			t.Errorf("call %d: retry_after %v; want the remaining cooldown (at most %v)", i+1, f.RetryAfter, cooldown)
		}
		if g, _, _ := a.log(); len(g) != want || f.Attempts != want {
			t.Errorf("call %d made %d attempts (the failure says %d); want %d", i+1, len(g), f.Attempts, want)
		}
		rpcs, replies := log.take()
		rec, _ := lastReply[*admissionv1.RecordOutcomeResponse](rpcs, replies, "RecordOutcome")
		if i == 0 {
			// The call ended with RecordOutcome's answer, not one backoff later.
			if !slices.Equal(rpcs, []string{"Pick", "RecordOutcome"}) {
				t.Errorf("call 1 sent %v; want Pick, RecordOutcome and nothing after", rpcs)
			}
			if r := rec.GetFailure(); r.GetReason() != admissionv1.FailureReason_FAILURE_REASON_SOURCE_DEAD ||
				r.GetRetryAfter().AsDuration() <= 0 || r.GetRetryAfter().AsDuration() > cooldown {
				t.Errorf("RecordOutcome answered %v; want Failure source_dead with the cooldown left", rec)
			}
		} else if rec != nil {
			t.Errorf("call 2 sent %v; want no attempt reported", rpcs)
		}
		t.Logf("call %d: failed source_dead after %v (%d attempts, RPCs %v, retry_after %v; cooldown %v)", i+1, elapsed, f.Attempts, rpcs, f.RetryAfter, cooldown)
	}
	if n := up.Count("primary"); n != 1 {
		t.Errorf("the upstream received %d requests; want the 1 that found the key dead", n)
	}
	src := sc.source(t, "chat", "primary")
	if src.GetState() != admissionv1.BreakerState_BREAKER_STATE_OPEN || src.GetOpenCause() != admissionv1.OpenCause_OPEN_CAUSE_SOURCE_DEAD {
		t.Errorf("DescribeScope: state %v cause %v; want OPEN because of SOURCE_DEAD", src.GetState(), src.GetOpenCause())
	}
}

// With source_dead: wait, a dead source is waited out like any OPEN one
// (circuit_open: wait): the call sleeps through the cooldown, probes and
// succeeds once the key works again.
func TestSourceDead_Wait(t *testing.T) {
	const cooldown = time.Second
	up := newUpstream(t)
	sc := startSidecar(t, quickstartScope("wait", cooldown.String(), up.URL+"/primary"))
	client := sc.client(t)
	ctx := ctxT(t)
	// The first attempt finds the key dead; the key works again after it.
	up.Set("primary", upstream.Step{Status: 401, Times: 1}, upstream.Step{Status: 200})
	a := &attempt{}
	start := time.Now()
	_, err := polygate.Do(ctx, client, "chat", a.fn)
	t.Logf("the call under source_dead: wait ended after %v (cooldown %v): %v", time.Since(start), cooldown, err)
	if err != nil {
		t.Fatalf("the call under source_dead: wait = %v; want success after the cooldown", err)
	}
	if g, _, _ := a.log(); len(g) != 2 || !g[1].Probe {
		t.Errorf("attempts %+v; want the dead one, then a probe", g)
	}
}
