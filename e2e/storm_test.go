package e2e

import (
	"errors"
	"testing"
	"time"

	polygate "github.com/polygate/polygate/clientsdk/go"
	"github.com/polygate/polygate/e2e/upstream"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// A 429 storm with Retry-After ends in stalled after the stall window,
// without burning max_attempts (429s are not charged) and never retrying
// earlier than the upstream's Retry-After.
func TestRateLimitStorm_EndsStalled(t *testing.T) {
	const (
		stallWindow = 2500 * time.Millisecond
		retryAfter  = time.Second
		maxAttempts = 2
	)
	up := newUpstream(t)
	sc := startSidecar(t, `
scopes:
  storm:
    circuit_open: wait
    max_attempts: 2
    backoff: {base: 10ms, max: 50ms}
    backpressure: {stall_window: 2500ms, poll_interval: 50ms}
    sources:
      - {name: primary, timeout: 5s, attributes: {base_url: "`+up.URL+`/storm"}}
`)
	client := sc.client(t)
	up.Set("storm", upstream.Step{Status: 429, Headers: map[string]string{"Retry-After": "1"}})

	a := &attempt{}
	start := time.Now()
	_, err := polygate.Do(ctxT(t), client, "storm", a.fn)
	elapsed := time.Since(start)

	var f *polygate.FailureError
	if !errors.As(err, &f) || f.Reason != polygate.Stalled || !errors.Is(err, polygate.ErrStalled) {
		t.Fatalf("the storm ended with %v; want stalled", err)
	}
	if f.Attempts <= maxAttempts {
		t.Errorf("%d attempts; want more than max_attempts (%d): 429s are not charged", f.Attempts, maxAttempts)
	}
	if elapsed < stallWindow {
		t.Errorf("stalled after %v; want no earlier than the stall window %v", elapsed, stallWindow)
	}
	if f.RetryAfter < retryAfter {
		t.Errorf("the stalled failure says retry after %v; want at least the upstream's %v", f.RetryAfter, retryAfter)
	}
	reqs := up.Requests("storm")
	if len(reqs) != f.Attempts {
		t.Errorf("the upstream received %d requests; the call reports %d attempts", len(reqs), f.Attempts)
	}
	assertSpacing(t, "retries of a 429 storm", reqs, retryAfter)
	src := sc.source(t, "storm", "primary")
	if src.GetState() != admissionv1.BreakerState_BREAKER_STATE_CLOSED || src.GetWindowFailures() != 0 {
		t.Errorf("breaker %v with %d failures; 429s are neutral for the breaker", src.GetState(), src.GetWindowFailures())
	}
	t.Logf("storm: %d attempts over %v, then stalled (retry after %v)", f.Attempts, elapsed, f.RetryAfter)
}
