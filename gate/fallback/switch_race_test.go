package fallback_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/fallback"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
)

// TestSwitchBeforeTheLocalCountIsLoaded: Admit's check of a decision raced
// by a change of mode reads the count of changes before call() reads the
// mode. (It read it inside the side's function, after: a caller that read
// "degraded" just before a check of Redis ended the degradation loaded the
// count after the change, so its local decision, made while another caller
// was granted the same slot on Redis, was not taken for raced and
// max_concurrency 1 had two holders.) The clock's hooks only order what two
// callers and the pinger do concurrently: caller x read the mode (degraded)
// and is in recovered(); the pinger's Check finds Redis back; caller y is
// granted on Redis while x's local decision is being made (under the local
// scope's lock, after leaveOut counted the Redis permits out: none yet).
func TestSwitchBeforeTheLocalCountIsLoaded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shared := &switchable{Backend: inmem.New(nil)}
	t0 := time.Unix(1_800_000_000, 0)
	var hook atomic.Pointer[func()]
	now := func() time.Time {
		if h := hook.Swap(nil); h != nil {
			(*h)()
		}
		return t0
	}
	b := fallback.New(shared, fallback.Options{Mode: fallback.Local, Replicas: 1, Now: now, PingEvery: time.Hour})
	src := gatetest.Src("only", func(s *gate.Source) { s.Limits.MaxConcurrency = 1 })
	req := func(id string) gate.AdmitRequest {
		return gate.AdmitRequest{Scope: "s", PermitID: id, Candidates: []gate.Candidate{{Source: src, Ceiling: 1}}}
	}

	shared.down.Store(true)
	if err := b.Check(ctx); err == nil || !b.Degraded() {
		t.Fatalf("Check with Redis down: %v, degraded=%v", err, b.Degraded())
	}

	var y gate.Admission
	var yerr error
	// Second hook: x's local decision reads its clock (inmem.lock) while y
	// asks Redis, now healthy, for the slot.
	during := func() { y, yerr = b.Admit(ctx, req("y")) }
	// First hook: x's recovered() reads the clock (before its ping is due):
	// the pinger finds Redis back meanwhile.
	first := func() {
		shared.down.Store(false)
		if err := b.Check(ctx); err != nil || b.Degraded() {
			t.Errorf("Check with Redis back: %v, degraded=%v", err, b.Degraded())
		}
		hook.Store(&during)
	}
	hook.Store(&first)

	x, xerr := b.Admit(ctx, req("x"))
	if xerr != nil || yerr != nil {
		t.Fatalf("x: %v, y: %v", xerr, yerr)
	}
	if !y.Granted {
		t.Fatalf("y on Redis: %+v, want granted (the only slot was free)", y)
	}
	if x.Granted {
		t.Fatalf("x granted (%+v) next to y's Redis permit: two holders on max_concurrency 1; "+
			"x's local decision raced the change of mode and was not given back", x.Permit)
	}
}
