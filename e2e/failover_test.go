package e2e

import (
	"testing"
	"time"

	polygate "github.com/polygate/polygate/clientsdk/go"
	"github.com/polygate/polygate/e2e/upstream"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// One source down: calls succeed on the other, the down source is probed
// (at most once per cooldown) and comes back.
func TestFailover(t *testing.T) {
	const cooldown = time.Second
	up := newUpstream(t)
	sc := startSidecar(t, `
scopes:
  failover:
    circuit_open: fail_fast
    max_attempts: 3
    backoff: {base: 5ms, max: 10ms}
    breaker: {fail_threshold: 2, min_calls: 100, fail_rate: 1.0, window: 60s, cooldown: 1s, max_cooldown: 1s}
    sources:
      - {name: a, priority: 0, timeout: 5s, attributes: {base_url: "`+up.URL+`/a"}}
      - {name: b, priority: 1, timeout: 5s, attributes: {base_url: "`+up.URL+`/b"}}
`)
	client := sc.client(t)
	ctx := ctxT(t)
	up.Set("a", upstream.Step{Status: 503})

	// served runs one call and returns the source that served it and
	// whether that call probed a.
	served := func() (string, bool) {
		t.Helper()
		a := &attempt{}
		if _, err := polygate.Do(ctx, client, "failover", a.fn); err != nil {
			t.Fatalf("call = %v; want success on one of the sources", err)
		}
		grants, _, _ := a.log()
		probedA := false
		for _, g := range grants {
			probedA = probedA || (g.Source == "a" && g.Probe)
		}
		return grants[len(grants)-1].Source, probedA
	}

	for i := range 10 {
		if src, _ := served(); src != "b" {
			t.Fatalf("call %d served by %s while a is down; want b", i+1, src)
		}
	}
	if st := sc.source(t, "failover", "a").GetState(); st != admissionv1.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("a's breaker is %v after failing; want OPEN", st)
	}

	// a is probed after its cooldown; while it is still down the call goes
	// on to b.
	time.Sleep(sc.retryAfter(t, "failover", "a"))
	if src, probed := served(); src != "b" || !probed {
		t.Fatalf("the call after a's cooldown: served by %s, probed a: %v; want a probed, then b", src, probed)
	}

	// a recovers: the next probe succeeds and a serves again.
	up.Set("a", upstream.Step{Status: 200})
	time.Sleep(sc.retryAfter(t, "failover", "a"))
	if src, probed := served(); src != "a" || !probed {
		t.Fatalf("the call after a recovered: served by %s, probed a: %v; want a, on its probe", src, probed)
	}
	for i := range 3 {
		if src, probed := served(); src != "a" || probed {
			t.Fatalf("call %d after a came back: served by %s (probe %v); want a, not a probe", i+1, src, probed)
		}
	}
	if st := sc.source(t, "failover", "a").GetState(); st != admissionv1.BreakerState_BREAKER_STATE_CLOSED {
		t.Errorf("a's breaker is %v after it came back; want CLOSED", st)
	}

	reqs := up.Requests("a")
	// 2 failures open the breaker, then one failed probe, then the
	// successful probe and 3 ordinary calls.
	if len(reqs) != 2+1+1+3 {
		t.Errorf("a received %d requests; want 7 (2 failures, 1 failed probe, 1 good probe, 3 calls)", len(reqs))
	}
	if len(reqs) >= 4 {
		assertSpacing(t, "a's probes while open", reqs[1:4], cooldown)
	}
	if n := up.Count("b"); n != 11 {
		t.Errorf("b received %d requests; want 11, one per call a could not serve", n)
	}
}
