package policy_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/fallback"
	"github.com/polygate/polygate/gate/gatetest"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/policy"
)

// With on_unavailable: local and two replicas, the local gate admits against
// the replica's share (max_concurrency 2 → 1). A caller refused for that
// share must wait, not be told "woken, sleep 0" by a check that applies the
// full limits: such an answer repeated is a caller spinning without ever
// reaching its stall budget.
func TestLocalShareWaiterDoesNotSpin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := config.Parse([]byte(`
scopes:
  s:
    backpressure: {poll_interval: 1s, stall_window: 10s}
    sources: [{name: only, max_concurrency: 2}]
`), nil)
		if err != nil {
			t.Fatal(err)
		}
		b := fallback.New(gatetest.Down{}, fallback.Options{Mode: fallback.Local, Replicas: 2})
		s := policy.NewScope(cfg.Scopes["s"], b, policy.Options{Rand: half})
		defer s.Close()

		holder := newCall(s)
		grant(t, s, holder)
		waiter := newCall(s)
		var trips, zeros, inARow, worst int
		var trace string
		for trips = 1; trips <= 1000; trips++ {
			if p := pick(t, s, waiter); p.NoRunnable == nil {
				t.Fatalf("round trip %d: Pick %+v, want refused (the share is held)", trips, p)
			}
			d, err := s.OnNoRunnable(ctx(t), waiter)
			if err != nil {
				t.Fatal(err)
			}
			if len(trace) < 400 {
				trace += fmt.Sprintf("%+v; ", d)
			}
			if d.Failure != nil {
				break
			}
			if d.Slept == 0 && d.Sleep == 0 {
				zeros++
				inARow++
				worst = max(worst, inARow)
			} else {
				inARow = 0
			}
			time.Sleep(d.Sleep)
		}
		if worst > 1 {
			t.Fatalf("%d round trips, %d answered at once without a wait (%d in a row): %s", trips, zeros, worst, trace)
		}
		if trips > 1000 {
			t.Fatalf("the waiter never failed stalled: %s", trace)
		}
	})
}

// optimist wraps a backend whose Peek always says "admissible", as a
// backend whose read disagrees with its Admit would.
type optimist struct{ gate.Backend }

func (o optimist) Peek(ctx context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	snap, err := o.Backend.Peek(ctx, req)
	for i := range snap.Sources {
		snap.Sources[i].Verdict = gate.Rejection{Source: snap.Sources[i].Source}
	}
	return snap, err
}

// Even a Peek that disagrees with Admit cannot make a caller spin: after an
// immediate wake-up that the next Pick did not turn into a grant,
// OnNoRunnable waits for a change.
func TestWokenNeverTwiceInARow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := config.Parse([]byte(`
scopes:
  s:
    backpressure: {poll_interval: 1s, stall_window: 10s}
    sources: [{name: only, max_concurrency: 1}]
`), nil)
		if err != nil {
			t.Fatal(err)
		}
		s := policy.NewScope(cfg.Scopes["s"], optimist{inmem.New(time.Now)}, policy.Options{Rand: half})
		defer s.Close()
		grant(t, s, newCall(s))
		waiter := newCall(s)
		inARow := 0
		for trips := 1; ; trips++ {
			if trips > 1000 {
				t.Fatal("the waiter never failed stalled")
			}
			pick(t, s, waiter)
			d, err := s.OnNoRunnable(ctx(t), waiter)
			if err != nil {
				t.Fatal(err)
			}
			if d.Failure != nil {
				break
			}
			if d.Slept == 0 && d.Sleep == 0 {
				if inARow++; inARow > 1 {
					t.Fatalf("round trip %d: a second immediate wake-up in a row: %+v", trips, d)
				}
			} else {
				inARow = 0
			}
			time.Sleep(d.Sleep)
		}
	})
}
