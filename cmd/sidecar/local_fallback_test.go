package main

import (
	"testing"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/redistest"
)

// TestForcedOpenSurvivesTheLocalFallback: an operator forces a source open
// through one replica; the other hears of it. Redis is lost and both
// replicas fall back to their local gates (on_unavailable: local): both
// keep refusing the source (forced_open, with who and why in
// DescribeScope), as Redis would. A local gate that started with every
// breaker CLOSED and no override would grant it at once.
func TestForcedOpenSurvivesTheLocalFallback(t *testing.T) {
	r := redistest.Start(t)
	c1, _ := replica(t, r.Addr, "local")
	c2, _ := replica(t, r.Addr, "local")
	ctx := testContext(t)
	a, b := caller{t, ctx, c1}, caller{t, ctx, c2}
	for _, c := range []caller{a, b} { // each replica has the scope in Redis
		c.report("reset", c.pick("reset"), admissionv1.Outcome_OUTCOME_SUCCESS)
	}
	if _, err := c1.OverrideBreaker(ctx, &admissionv1.OverrideBreakerRequest{
		Scope: "reset", Source: "only", Action: admissionv1.OverrideAction_OVERRIDE_ACTION_FORCE_OPEN, Actor: "ops", Reason: "leaked key",
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the override's announcement reaches the other sidecar", func() bool {
		return b.describe("reset").Sources[0].OverrideActor == "ops"
	})
	r.Stop()
	for i, c := range []caller{a, b} {
		eventually(t, ctx, "the local fallback", func() bool {
			c.pick("probe") // any call finds Redis gone
			return c.describe("reset").Backend == "redis (unavailable: local fallback)"
		})
		if p := c.pick("reset"); p.GetGrant() != nil {
			t.Fatalf("replica %d granted a source forced open in Redis from its local gate: %v", i+1, p)
		}
		d := c.describe("reset").Sources[0]
		if d.Override != admissionv1.Override_OVERRIDE_FORCED_OPEN || d.OverrideActor != "ops" || d.OverrideReason != "leaked key" {
			t.Fatalf("replica %d's local view of the source: %v, want forced open by ops (leaked key)", i+1, d)
		}
	}
}
