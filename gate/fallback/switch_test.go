package fallback_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/gate"
	"github.com/polygate/polygate/gate/fallback"
	"github.com/polygate/polygate/gate/inmem"
	"github.com/polygate/polygate/policy"
)

// switchable is a shared backend that stops answering when down is set: a
// memory backend standing in for Redis, so that the switch runs in a
// synctest bubble.
type switchable struct {
	*inmem.Backend
	down atomic.Bool
}

func (s *switchable) Admit(ctx context.Context, req gate.AdmitRequest) (gate.Admission, error) {
	if s.down.Load() {
		return gate.Admission{}, gate.ErrUnavailable
	}
	return s.Backend.Admit(ctx, req)
}

func (s *switchable) Settle(ctx context.Context, req gate.SettleRequest) (gate.Settlement, error) {
	if s.down.Load() {
		return gate.Settlement{}, gate.ErrUnavailable
	}
	return s.Backend.Settle(ctx, req)
}

func (s *switchable) Peek(ctx context.Context, req gate.PeekRequest) (gate.Snapshot, error) {
	if s.down.Load() {
		return gate.Snapshot{}, gate.ErrUnavailable
	}
	return s.Backend.Peek(ctx, req)
}

func (s *switchable) Leave(ctx context.Context, req gate.LeaveRequest) error {
	if s.down.Load() {
		return gate.ErrUnavailable
	}
	return s.Backend.Leave(ctx, req)
}

func (s *switchable) Ping(context.Context) error {
	if s.down.Load() {
		return gate.ErrUnavailable
	}
	return nil
}

// TestHeldCallerAcrossTheSwitch: a caller asks (quota_full: wait) for the
// only slot, which another call holds on Redis, when Redis is lost. The
// local gate does not hand it the slot the holder still uses: the caller is
// held through ten polls of the scope; when the holder reports, it is woken
// within a poll_interval (the scope's poller finds the local slot free: a
// caller in line waits for its line, and the local line hands off only the
// local gate's own slots) and granted locally, not at its first Pick after
// the switch next to the holder: two holders on max_concurrency 1.
func TestHeldCallerAcrossTheSwitch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		cfg, err := config.Parse([]byte(`
scopes:
  s:
    backpressure: {poll_interval: 1s, stall_window: 1h}
    sources: [{name: only, max_concurrency: 1}]
`), nil)
		if err != nil {
			t.Fatal(err)
		}
		shared := &switchable{Backend: inmem.New(nil)}
		s := policy.NewScope(cfg.Scopes["s"], fallback.New(shared, fallback.Options{Mode: fallback.Local, Replicas: 1}), policy.Options{Rand: func() float64 { return 0.5 }})
		defer s.Close()
		call := func() *policy.Call { return policy.NewCall(policy.NewID("c"), "s", 0, time.Time{}, time.Now()) }

		holder := call()
		p, err := s.Pick(ctx, holder)
		if err != nil || p.Grant == nil {
			t.Fatalf("the holder's Pick on Redis: %+v %v", p, err)
		}
		held := p.Grant.Permit
		shared.down.Store(true)

		waiter := call()
		if p, err := s.Pick(ctx, waiter); err != nil || p.Grant != nil {
			t.Fatalf("the waiter's Pick after the switch: %+v %v, want refused (the holder still uses the slot)", p, err)
		}
		answered := make(chan policy.Decision, 1)
		go func() {
			d, err := s.OnNoRunnable(ctx, waiter)
			if err != nil {
				t.Error(err)
			}
			answered <- d
		}()
		time.Sleep(10 * cfg.Scopes["s"].PollInterval) // ten reads of the local gate by the scope's poller
		synctest.Wait()
		select {
		case d := <-answered:
			t.Fatalf("the waiter was answered before the holder reported: %+v", d)
		default: // held
		}
		reported := time.Now()
		if _, err := s.RecordOutcome(ctx, holder, policy.Attempt{PermitID: held.ID, Outcome: policy.Success, ActualTokens: -1}); err != nil {
			t.Fatal(err)
		}
		d := <-answered
		if poll := cfg.Scopes["s"].PollInterval; !d.Woken || time.Since(reported) > poll {
			t.Fatalf("the waiter after the holder's report: %+v after %v, want woken within a poll_interval (%v)", d, time.Since(reported), poll)
		}
		if p, err := s.Pick(ctx, waiter); err != nil || p.Grant == nil {
			t.Fatalf("the woken waiter's Pick: %+v %v, want the local slot", p, err)
		}
	})
}
